/*
 * random.c — Philox generators: a (seed, offset) pair behind a mutex.
 *
 * A generator hands out ranges of Philox blocks: a fill of n elements reserves the blocks it
 * will read (em_generator_reserve) and passes (seed, offset) to the backend's kernel, which
 * computes each element from its index alone (ember/random.h). Two fills never overlap, even
 * from different threads, and the numbers do not depend on the backend or thread count.
 */
#include <errno.h>
#include <stdlib.h>

#include "ember/error.h"
#include "ember/random.h"
#include "internal.h"

struct em_generator {
    em_rng_state state;
    pthread_mutex_t lock; /* guards state */
};

/* The process's default generator: static, so that it exists before em_init() too. */
static em_generator default_gen = {{0, 0}, PTHREAD_MUTEX_INITIALIZER};

/* NULL means the default generator. The lock is logically mutable, so readers taking a
 * const generator cast it away here and only here. */
static em_generator *resolve(const em_generator *g) {
    return g ? (em_generator *)g : &default_gen;
}

em_generator *em_generator_new(uint64_t seed) {
    em_generator *g = em__malloc(sizeof *g, "em_generator_new");
    if (!g)
        return NULL;
    if (pthread_mutex_init(&g->lock, NULL) != 0) {
        em__free(g);
        em_set_error(EM_ERR_NOMEM, "em_generator_new: cannot create a mutex");
        return NULL;
    }
    g->state = (em_rng_state){.seed = seed, .offset = 0};
    em__live_inc(EM__LIVE_GENERATOR);
    return g;
}

void em_generator_free(em_generator *g) {
    if (!g || g == &default_gen) /* the default generator is not the caller's to free */
        return;
    pthread_mutex_destroy(&g->lock);
    em__free(g);
    em__live_dec(EM__LIVE_GENERATOR);
}

em_generator *em_default_generator(void) {
    return &default_gen;
}

void em_seed(uint64_t seed) {
    em_generator_set_state(NULL, (em_rng_state){.seed = seed, .offset = 0});
}

em_rng_state em_generator_get_state(const em_generator *g) {
    em_generator *r = resolve(g);
    pthread_mutex_lock(&r->lock);
    em_rng_state s = r->state;
    pthread_mutex_unlock(&r->lock);
    return s;
}

void em_generator_set_state(em_generator *g, em_rng_state s) {
    em_generator *r = resolve(g);
    pthread_mutex_lock(&r->lock);
    r->state = s;
    pthread_mutex_unlock(&r->lock);
}

/* The 64-bit offset wraps after 2^64 blocks (2^66 numbers), which no program reaches. */
em_rng_state em_generator_reserve(em_generator *g, uint64_t blocks) {
    em_generator *r = resolve(g);
    pthread_mutex_lock(&r->lock);
    em_rng_state s = r->state;
    r->state.offset += blocks;
    pthread_mutex_unlock(&r->lock);
    return s;
}

/* EMBER_SEED as an unsigned 64-bit number (decimal, or hex with 0x); false if malformed. */
static bool parse_seed(const char *s, uint64_t *out /* out */) {
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s == '\0' || *s == '-' || *s == '+')
        return false;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno != 0 || end == s)
        return false;
    while (*end == ' ' || *end == '\t' || *end == '\n')
        end++;
    if (*end != '\0')
        return false;
    *out = (uint64_t)v;
    return true;
}

void em__random_init(void) {
    uint64_t seed = 0;
    const char *env = getenv("EMBER_SEED");
    if (env && !parse_seed(env, &seed)) {
        em_log_write(EM_LOG_WARN,
                     "EMBER_SEED='%.64s' is not an unsigned 64-bit integer; using 0", env);
        seed = 0;
    }
    em_seed(seed);
}

void em__random_shutdown(void) {
    /* Nothing is allocated for the default generator; leave it as a fresh em_init() would. */
    em_seed(0);
}
