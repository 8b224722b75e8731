/*
 * ddp.c — ember-train under `mpirun -np N` (docs/distributed.md, "The trainer"): the run's
 * communicator, the checks that every rank runs the same thing, the model's data-parallel
 * wrapper (ember/ddp.h), each rank's random stream, and the small collectives the loop uses
 * to keep the ranks in step (figures, stop decisions, checkpoint status).
 *
 * A plain run never starts MPI: a communicator is made only when the process was started by
 * an MPI launcher, as its environment says (Open MPI's OMPI_COMM_WORLD_SIZE, a PMI or PMIx
 * launcher's PMI_SIZE / PMIX_RANK, e.g. Slurm's srun), and a world of one rank is a plain run.
 *
 * Keeping the ranks in step. Every rank must start the same collectives in the same order,
 * so every decision that leads to one (stop after this step, evaluate, save, give up) is
 * taken on figures reduced over the ranks, never on a rank's own clock, signal or file error:
 * the loop reduces its step figures and flags once or twice per step (ddp_sum), and the
 * failures of one rank (a file rank 0 could not write) reach the others through ddp_agree.
 * An error that only one rank meets elsewhere (an op failing mid-step) cannot be agreed on:
 * that rank leaves at once without shutting MPI down (ddp_exit), which makes mpirun end the
 * job instead of leaving the others waiting for it.
 */
#include "ember/comm.h"
#include "ember/ddp.h"
#include "ember/error.h"
#include "ember/random.h"
#include "ember/tensor.h"
#include "trainer.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The launcher variables, in the order they are looked for. */
static const char *const launch_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};

const char *ddp_launcher(void) {
    for (size_t i = 0; i < sizeof launch_vars / sizeof *launch_vars; i++) {
        const char *v = getenv(launch_vars[i]);
        if (v && *v) return launch_vars[i];
    }
    return NULL;
}

int ddp_start(run *r) {
    r->d.rank = 0;
    r->d.world = 1;
    r->d.first_failed = -1;
    const char *var = ddp_launcher();
    if (!var) return 0;
    em_comm *c = em_comm_new("mpi", NULL);
    if (!c) {
        fprintf(stderr, "ember-train: started by an MPI launcher (%s=%s) but no communicator: "
                "%s\n", var, getenv(var), em_last_error());
        if (em_last_status() == EM_ERR_NOTFOUND)
            fprintf(stderr, "  this Ember was built without Open MPI (configure --without-mpi, "
                    "or libopenmpi-dev missing): run ember-train without mpirun\n");
        return EXIT_USAGE;
    }
    if (em_comm_size(c) == 1) { /* mpirun -np 1: the plain run */
        em_comm_free(c);
        return 0;
    }
    r->d.comm = c;
    r->d.rank = em_comm_rank(c);
    r->d.world = em_comm_size(c);
    return 0;
}

/* A CPU float64 / int64 tensor of n elements holding v. */
static em_tensor *host_tensor(const void *v, int64_t n, em_dtype dt) {
    return em_from_data(v, 1, &n, dt, em_cpu());
}

em_status ddp_sum(run *r, double *v, int n) {
    if (!r->d.comm) return EM_OK;
    em_tensor *t = host_tensor(v, n, EM_F64);
    if (!t) return em_last_status();
    em_status s = em_comm_wait(em_comm_allreduce(r->d.comm, t, EM_REDUCE_SUM));
    if (s == EM_OK) memcpy(v, em_tensor_data(t), sizeof(double) * (size_t)n);
    em_tensor_release(t);
    return s;
}

/* out[rank * n + i] = rank's v[i], for every rank. */
static em_status gather_i64(run *r, const int64_t *v, int n, int64_t *out) {
    em_tensor *in = host_tensor(v, n, EM_I64);
    int64_t total = (int64_t)n * r->d.world;
    em_tensor *all = em_empty(1, &total, EM_I64, em_cpu());
    em_status s = in && all ? em_comm_wait(em_comm_allgather(r->d.comm, all, in))
                            : em_last_status();
    if (s == EM_OK) memcpy(out, em_tensor_data(all), sizeof(int64_t) * (size_t)total);
    em_tensor_release(in);
    em_tensor_release(all);
    return s;
}

/* A communicator failure in the middle of the trainer's own collectives: nothing to agree on. */
static void comm_failed(run *r, const char *what) {
    fprintf(stderr, "ember-train (rank %d): %s: %s\n", r->d.rank, what, em_last_error());
    r->d.agreed = false;
    ddp_exit(r, EXIT_TRAIN);
}

int ddp_agree(run *r, int rc) {
    if (!r->d.comm) return rc;
    int64_t mine = rc, *all = malloc(sizeof(int64_t) * (size_t)r->d.world);
    if (!all) {
        em_set_error(EM_ERR_NOMEM, "out of memory");
        comm_failed(r, "agreeing on the exit code");
    }
    if (gather_i64(r, &mine, 1, all) != EM_OK) {
        free(all);
        comm_failed(r, "agreeing on the exit code");
    }
    int first = -1;
    for (int k = 0; k < r->d.world; k++)
        if (all[k] && first < 0) first = k;
    if (first >= 0) {
        if (!rc) {
            rc = (int)all[first];
            if (r->d.rank == 0)
                fprintf(stderr, "ember-train: rank %d stopped (exit code %d, its message above): "
                        "every rank stops\n", first, rc);
        }
        r->d.agreed = true;
    }
    r->d.first_failed = first;
    free(all);
    return rc;
}

void ddp_exit(run *r, int rc) {
    if (!r->d.comm || !rc || r->d.agreed) return;
    /* The others may be waiting in a collective this rank will never start: leaving without
     * MPI_Finalize (which would wait for them) makes mpirun end the job. */
    fflush(stdout);
    fflush(stderr);
    _exit(rc);
}

void ddp_free(run *r) {
    em_ddp_free(r->d.ddp);
    r->d.ddp = NULL;
    em_comm_free(r->d.comm);
    r->d.comm = NULL;
}

/* FNV-1a, 64 bits. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int64_t ddp_hash_text(const char *s) {
    return (int64_t)fnv(0xcbf29ce484222325ull, s ? s : "", s ? strlen(s) + 1 : 0);
}

int64_t ddp_hash_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint64_t h = 0xcbf29ce484222325ull;
    char buf[8192];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) h = fnv(h, buf, n);
    fclose(f);
    return (int64_t)h;
}

int ddp_check_same(run *r, const ddp_setting *set, int n) {
    if (!r->d.comm) return 0;
    int64_t *mine = malloc(sizeof(int64_t) * (size_t)n);
    int64_t *all = malloc(sizeof(int64_t) * (size_t)n * (size_t)r->d.world);
    if (!mine || !all) {
        free(mine);
        free(all);
        em_set_error(EM_ERR_NOMEM, "out of memory");
        comm_failed(r, "comparing the ranks' configs");
    }
    for (int i = 0; i < n; i++) mine[i] = set[i].value;
    if (gather_i64(r, mine, n, all) != EM_OK) {
        free(mine);
        free(all);
        comm_failed(r, "comparing the ranks' configs");
    }
    int rc = 0;
    for (int k = 1; k < r->d.world && !rc; k++)
        for (int i = 0; i < n && !rc; i++) {
            int64_t a = all[i], b = all[(size_t)k * (size_t)n + (size_t)i];
            if (a == b) continue;
            rc = EXIT_USAGE;
            if (r->d.rank != 0) break; /* rank 0 says it, once */
            if (set[i].kind == DDP_HASH) {
                fprintf(stderr, "ember-train: rank %d's %s differs from rank 0's (hash %016" PRIx64
                        " against %016" PRIx64 "): every rank must run the same config and "
                        "options\n", k, set[i].name, (uint64_t)b, (uint64_t)a);
            } else if (set[i].kind == DDP_REAL) {
                double x, y;
                memcpy(&x, &b, sizeof x);
                memcpy(&y, &a, sizeof y);
                fprintf(stderr, "ember-train: rank %d's %s is %.17g where rank 0's is %.17g: "
                        "every rank must run the same config and options\n", k, set[i].name,
                        x, y);
            } else
                fprintf(stderr, "ember-train: rank %d's %s is %" PRId64 " where rank 0's is %"
                        PRId64 ": every rank must run the same config and options\n", k,
                        set[i].name, b, a);
        }
    free(mine);
    free(all);
    if (rc) r->d.agreed = true; /* every rank saw the same table */
    return rc;
}

/* A rank's own stream, apart from every other rank's: rank 0 keeps the seed's (the stream of
 * a single process with the same seed); rank k > 0 starts at offset 0 of a seed mixed from the
 * run's seed and k (SplitMix64's finaliser). */
static uint64_t rank_seed(uint64_t seed, int rank) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)rank;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int ddp_wrap(run *r) {
    if (!r->d.comm) return 0;
    em_ddp_options o = {.struct_size = sizeof o,
                        .bucket_bytes = r->s.ddp_bucket_mib > 0
                                            ? (int64_t)(r->s.ddp_bucket_mib * 1048576.0)
                                            : 0};
    if (o.bucket_bytes < 0) o.bucket_bytes = 0;
    if (!(r->d.ddp = em_ddp_wrap(r->model, r->d.comm, &o))) {
        fprintf(stderr, "ember-train (rank %d): data parallelism: %s\n", r->d.rank, em_last_error());
        /* a mismatch is found by every rank alike; a communicator failure is not */
        return ddp_agree(r, EXIT_USAGE);
    }
    int nb = em_ddp_bucket_count(r->d.ddp);
    int64_t bytes = 0;
    for (int i = 0; i < nb; i++) {
        em_ddp_bucket_info bi = {.struct_size = sizeof bi};
        if (em_ddp_bucket_get(r->d.ddp, i, &bi) == EM_OK) bytes += bi.bytes;
    }
    say(r, "ember-train: gradients of %.1f KiB in %d bucket%s (--ddp-bucket-mib %g)\n",
        (double)bytes / 1024.0, nb, nb == 1 ? "" : "s",
        r->s.ddp_bucket_mib > 0 ? r->s.ddp_bucket_mib : 25.0);
    if (r->d.have_rng) em_generator_set_state(NULL, r->d.rng);
    else if (r->d.rank > 0) em_generator_set_state(NULL, (em_rng_state){rank_seed(r->s.seed, r->d.rank), 0});
    return 0;
}

/* ---- every rank's random stream in rank 0's checkpoint ------------------------------------ */

em_status ddp_rng_text(run *r, char **text) {
    *text = NULL;
    if (!r->d.comm) return EM_OK;
    em_rng_state st = em_generator_get_state(NULL);
    int64_t mine[2] = {(int64_t)st.seed, (int64_t)st.offset};
    int64_t *all = malloc(sizeof(int64_t) * 2 * (size_t)r->d.world);
    if (!all) return em_set_error(EM_ERR_NOMEM, "checkpoint: out of memory");
    em_status s = gather_i64(r, mine, 2, all);
    size_t cap = (size_t)r->d.world * 44 + 1;
    char *t = s == EM_OK ? malloc(cap) : NULL;
    if (s == EM_OK && !t) s = em_set_error(EM_ERR_NOMEM, "checkpoint: out of memory");
    if (t) {
        size_t n = 0;
        for (int k = 0; k < r->d.world; k++)
            n += (size_t)snprintf(t + n, cap - n, "%s%" PRIu64 ":%" PRIu64, k ? "," : "",
                                  (uint64_t)all[2 * k], (uint64_t)all[2 * k + 1]);
        *text = t;
    }
    free(all);
    return s;
}

em_status ddp_rng_parse(run *r, const char *path, const char *text) {
    const char *p = text;
    for (int k = 0; k <= r->d.rank; k++) {
        char *end;
        unsigned long long seed = strtoull(p, &end, 10), off;
        if (end == p || *end != ':') goto bad;
        p = end + 1;
        off = strtoull(p, &end, 10);
        if (end == p || (*end != ',' && *end != '\0') || (*end == '\0' && k < r->d.rank)) goto bad;
        if (k == r->d.rank) r->d.rng = (em_rng_state){seed, off};
        p = end + (*end == ',');
    }
    r->d.have_rng = true;
    return EM_OK;
bad:
    return em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata 'train.rng_ranks' is '%.80s'; "
                        "expected SEED:OFFSET for each of the run's ranks, comma-separated", path,
                        text);
}

/* ---- checkpoint status from rank 0 -------------------------------------------------------- */

em_status ddp_share_status(run *r, em_status s, bool *saved, const char *path) {
    if (!r->d.comm) return s;
    int64_t v[2] = {(int64_t)s, *saved};
    em_tensor *t = host_tensor(v, 2, EM_I64);
    if (!t || em_comm_wait(em_comm_broadcast(r->d.comm, t, 0)) != EM_OK) {
        em_tensor_release(t);
        comm_failed(r, "checkpoint");
    }
    memcpy(v, em_tensor_data(t), sizeof v);
    em_tensor_release(t);
    if (r->d.rank == 0) return s;
    *saved = v[1] != 0;
    if (v[0] == EM_OK) return EM_OK;
    return em_set_error((em_status)v[0], "rank 0 could not %s %s (its message above)",
                        *saved ? "rotate the checkpoints after" : "write the checkpoint", path);
}
