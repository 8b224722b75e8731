/*
 * internal.h — structures and functions shared by the core's subsystems; never installed.
 * Non-static functions shared between core files are prefixed em__.
 */
#ifndef EMBER_INTERNAL_H
#define EMBER_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/random.h"
#include "ember/tensor.h"

/* Types this header's prototypes take by pointer only: declared, not included, so that
 * touching module.h, optim.h, serialize.h, dict.h or plugin.h rebuilds only their users
 * (C11 allows the typedef again where a file includes the header as well). */
typedef struct em_dict em_dict;
typedef struct em_module em_module;
typedef struct em_optimizer em_optimizer;
typedef struct em_scheduler em_scheduler;
typedef struct em_metadata em_metadata;
typedef struct em_load_options em_load_options;
typedef struct em_load_report em_load_report;
typedef struct em_kernel_info em_kernel_info;

/* ---- host memory (alloc.c) ---------------------------------------------------------------- */

/* Through the injectable host allocator; these set EM_ERR_NOMEM naming `what` on failure. */
void *em__malloc(size_t n, const char *what);
void *em__calloc(size_t count, size_t size, const char *what);
void *em__realloc(void *p, size_t old_n, size_t new_n, const char *what);
char *em__strdup(const char *s, const char *what);
void em__free(void *p);

/* ---- hashed string index (strindex.c) ----------------------------------------------------- */

/* An index over an array of keys the caller owns (config maps and anchors, safetensors
 * metadata, option bags): slots hold position + 1. Key i is the string pointer at
 * (char *)keys + i * stride (an array of strings: stride sizeof(char *); an array of structs:
 * the first struct's name field and the struct's size). Zero-initialise; em__strindex_free.
 * Lookups and adds add their key comparisons to *compares (may be NULL). */
typedef struct em__strindex {
    size_t *slots;
    size_t cap, count;
} em__strindex;
uint64_t em__strhash(const char *s); /* seeded once per process */
/* Position of key among the keys, or -1. */
ptrdiff_t em__strindex_find(const em__strindex *x, const void *keys, size_t stride,
                            const char *key, uint64_t *compares);
/* File key pos (an equal key already filed is replaced by pos). EM_ERR_NOMEM, leaving the
 * index as it was. */
em_status em__strindex_add(em__strindex *x, const void *keys, size_t stride, size_t pos,
                           uint64_t *compares);
void em__strindex_free(em__strindex *x);

/* ---- loading optimizer and scheduler state in two steps (optim.c) -------------------------- */

/* em_checkpoint_load checks every part of a file before it restores any: prepare checks a
 * state dict whole and builds what it will put in place (a scheduler's class state is loaded
 * already, with what it replaced kept); commit swaps it in and cannot fail; discard drops it
 * (putting a scheduler's class state back). Both consume p. */
typedef struct em__optim_load em__optim_load;
em_status em__optimizer_load_prepare(const em_optimizer *o, const em_dict *tensors,
                                     const char *groups_json, em__optim_load **out);
void em__optimizer_load_commit(em_optimizer *o, em__optim_load *p);
void em__optimizer_load_discard(const em_optimizer *o, em__optim_load *p);
/* The gradient scaler's step skipped on the device (grad_scaler.c, capturable): every tensor
 * a step may change (each parameter, then each of its states, in parameter order) into out
 * (cap entries; borrowed); the count, or -1 (error set) past cap. */
int em__optimizer_step_tensors(const em_optimizer *o, em_tensor **out, int cap);
/* The tensor count em__optimizer_step_tensors gives. */
int em__optimizer_step_tensor_count(const em_optimizer *o);
/* Take back the count of a step em_optimizer_step took that the device then undid. */
void em__optimizer_uncount(em_optimizer *o);
typedef struct em__sched_load em__sched_load;
em_status em__scheduler_load_prepare(em_scheduler *s, const char *json, em__sched_load **out);
void em__scheduler_load_commit(em_scheduler *s, em__sched_load *p);
void em__scheduler_load_discard(em_scheduler *s, em__sched_load *p);

/* ---- caching device allocator (alloc.c) --------------------------------------------------- */

typedef struct em__block {
    void *ptr;
    size_t size;            /* bytes obtained (rounded) */
    em_mem_category cat;
    struct em__block *next; /* free-list link while cached or waiting for events */
    struct em__pool *pool;  /* the cache of the stream it was allocated on; it returns there */
    struct em__uses *uses;  /* other streams that used it (em_tensor_record_stream); NULL: none */
} em__block;

typedef struct em__allocator em__allocator;

/* One allocator per device; the device's ops table must outlive it. */
em__allocator *em__allocator_new(em_device dev, const em_device_ops *ops);
void em__allocator_free(em__allocator *a); /* returns cached blocks; live blocks leak */
/* A block of at least nbytes (nbytes may be 0: a valid block of the minimum size). On device
 * out-of-memory empties the cache and retries once, then EM_ERR_NOMEM with a message naming
 * the device, the request and what holds the memory. */
em_status em__allocator_alloc(em__allocator *a, size_t nbytes, em_mem_category cat,
                              em__block **out);
void em__allocator_release(em__allocator *a, em__block *b);
/* Stream s (of the allocator's device) uses b too: on release b is reused only once the work
 * s had queued by then is done. EM_ERR_NOMEM when the record cannot grow. */
em_status em__allocator_record_stream(em__allocator *a, em__block *b, em_stream *s);
/* Stream s is being freed and its work is done: its cached blocks serve every stream, and the
 * blocks that recorded it no longer wait for it. */
void em__allocator_stream_gone(em__allocator *a, em_stream *s);
/* Graph capture's pool (alloc.c, "Graph capture"): from capture_begin until capture_end the
 * allocations of stream s come from *pool; graph_gone (the graph was freed, its replays are
 * done, or the capture failed) hands the pool's blocks to the default stream's cache. */
struct em__pool;
em_status em__allocator_capture_begin(em__allocator *a, em_stream *s, struct em__pool **pool);
void em__allocator_capture_end(em__allocator *a, struct em__pool *pool);
void em__allocator_graph_gone(em__allocator *a, struct em__pool *pool);
void em__allocator_set_category(em__allocator *a, em__block *b, em_mem_category cat);
void em__allocator_stats(em__allocator *a, em_memory_stats *out);
void em__allocator_reset_peak(em__allocator *a);
void em__allocator_empty_cache(em__allocator *a);

/* ---- devices (device.c) ------------------------------------------------------------------- */

typedef struct em__device_type {
    bool used;
    em_device_ops ops;           /* copied, missing trailing slots zeroed */
    char name[32];
    em_registry *owner;
    em__allocator *alloc[64];    /* per ordinal, created on first use */
    pthread_mutex_t lock;
    /* Execution contexts (exec.c): the default stream's per ordinal (read without the lock:
     * the dispatcher's one load), and every one made, for lookup and freeing (under lock). */
    em_exec_ctx *exec_default[64];
    struct em__exec *execs;
} em__device_type;

extern em__device_type em__device_types[EM_MAX_DEVICE_TYPES];

/* Validates dev (type registered, ordinal in range); EM_ERR_DEVICE otherwise. */
em_status em__device_check(em_device dev, const char *who);
const em_device_ops *em__device_ops(em_device dev);
em__allocator *em__device_allocator(em_device dev); /* NULL + error on failure */
/* The allocator dev already has, or NULL (its device type was removed): no checks, no error;
 * for handing back a block that allocator gave out. */
em__allocator *em__device_allocator_existing(em_device dev);
void em__devices_shutdown(void);
/* em_to_device_async's host sources (copy_async.c): wait for the copies of dev and drop their
 * references; drop those whose copies are done (no waiting); wait for all (em_shutdown). */
void em__async_copies_wait(em_device dev);
void em__async_copies_poll(void);
void em__async_copies_shutdown(void);
/* Copy n bytes from host memory src into device tensor dst's data on stream s of dst's
 * device, without waiting: src is copied first into a host tensor kept alive until the copy
 * has run (as em_to_device_async keeps its sources). */
em_status em__host_to_device_async(em_tensor *dst, const void *src, size_t n, em_stream *s);
/* The (seed, offset) an op on `dev` draws `blocks` Philox blocks at, from gen (NULL: the
 * default generator). Eagerly: em_generator_reserve's, *graph false. While this thread
 * captures a graph on dev: relative to the capture's generator state (ember/random.h, "Graph
 * capture"): out->offset is the capture's blocks so far, out->seed 0, *graph true, and the
 * generator does not move (each replay takes the blocks). `covered` false (an op whose
 * kernels do not read the state) or a second generator in one capture: EM_ERR_STATE naming
 * `who`. */
em_status em__rng_draw(em_generator *gen, uint64_t blocks, em_device dev, const char *who,
                       bool covered, em_rng_state *out /* out */, bool *graph /* out */);
void em__device_types_remove_owner(em_registry *owner);
int em__device_type_find(const char *name); /* index or -1 */
/* The calling thread's current stream on dev (em_stream_current without the checks): inline
 * down to one initial-exec thread-local load while the thread has set no stream (every op
 * call asks). */
extern __attribute__((tls_model("initial-exec"))) _Thread_local int em__streams_set;
em_stream *em__stream_lookup(em_device dev);
static inline em_stream *em__stream_current(em_device dev) {
    return __builtin_expect(em__streams_set == 0, 1) ? NULL : em__stream_lookup(dev);
}

/* ---- execution contexts and backend functions (exec.c) ----------------------------------- */

/* The execution context of (dev, s), made on first use; NULL with the error set. */
em_exec_ctx *em__exec_make(em_device dev, em_stream *s);
/* The dispatcher's: the default stream's context is one load once it exists. */
static inline em_exec_ctx *em__exec_get(em_device dev, em_stream *s) {
    em_exec_ctx *x = s ? NULL
                       : __atomic_load_n(&em__device_types[dev.type].exec_default[dev.index],
                                         __ATOMIC_ACQUIRE);
    return x ? x : em__exec_make(dev, s);
}
/* Free the contexts of device type t: those of stream s on ordinal index, or (all true)
 * every one. */
void em__exec_free(em__device_type *t, int index, em_stream *s, bool all);
/* Hand back the workspace a kernel call took (em_kernel_workspace); after its kernel ran. */
void em__workspace_release(em_kernel_ctx *k);

/* Copy between any two devices (through the host when neither is the CPU); counts bytes. */
em_status em__device_copy(em_device dst_dev, void *dst, em_device src_dev, const void *src,
                          size_t nbytes);

/* em_dtype_size for a dtype known to be valid (a tensor's), inlined on the op hot path. */
extern const size_t em__dtype_sizes[EM_DTYPE_COUNT];
static inline size_t em__dtype_size(em_dtype dt) { return em__dtype_sizes[dt]; }

/* ---- storage and tensors (tensor.c) ------------------------------------------------------- */

typedef struct em__storage {
    atomic_int refcount;
    atomic_uint_fast64_t version;
    void *data;
    size_t nbytes;
    em_device device;
    em__block *block;          /* allocator block; NULL for wrapped memory */
    em_release_fn release;     /* wrapped memory */
    void *release_user;
    atomic_uint_fast64_t id;   /* em_ktensor.storage_id: 0 until a kernel first sees it */
    atomic_int layout;         /* em_layout; non-plain only for one dense 4-dim tensor */
} em__storage;

typedef struct em__node em__node;
typedef struct em__hook em__hook;
typedef struct em__theap em__theap;

struct em_tensor {
    uint32_t magic;            /* EM__TENSOR_LIVE; EM__TENSOR_FREED once freed (quarantined) */
    atomic_int refcount;
    atomic_int scope_refs;     /* how many of the references belong to open scopes */
    em__storage *storage;
    em_dtype dtype;
    int ndim;
    int64_t offset;            /* elements */
    int64_t numel;
    int64_t shape[EM_MAX_DIMS];
    int64_t strides[EM_MAX_DIMS];
    /* autograd (autograd.c) */
    bool requires_grad;        /* a leaf that requires grad, or a tensor with a grad_fn */
    bool retains_grad;         /* em_retain_grad on a non-leaf */
    bool is_view;              /* made by a view function: shares a base's storage */
    bool inference;            /* made under EM_GRAD_INFERENCE */
    bool view_base_requires_grad; /* is_view, and the base required grad when it was made */
    int output_nr;             /* which output of grad_fn this is */
    em__node *grad_fn;         /* owned reference; NULL for leaves */
    em_tensor *grad;           /* owned reference; NULL when none */
    em__hook *hooks;           /* leaf hooks (non-leaf hooks live on grad_fn) */
    em__hook *post_hooks;      /* leaf post-accumulation hooks (autograd.c) */
    uint64_t post_run;         /* the backward run that counts post_pending */
    int post_pending;          /* that run's contributions still to come */
    bool post_got;             /* that run accumulated into .grad */
    em_tensor *view_base;      /* is_view: owned reference to the tensor (not a view) whose
                                  storage this views; NULL otherwise */
    uint64_t view_version;     /* the storage's version when this view's history was set */
    /* The scope that last took a reference (em_scope_begin's file:line; NULL when none) while
     * live; once freed, the scope that dropped the last reference (NULL: an explicit release). */
    const char *site_file;
    int site_line;
    /* Live-list bookkeeping (tensor.c): the heap of the thread that made it. */
    em__theap *heap;
    em_tensor *live_prev, *live_next;
    em_tensor *remote_next;    /* on heap->remote, freed by another thread */
};

#define EM__TENSOR_LIVE 0x7e4a11e5u
#define EM__TENSOR_FREED 0xdeadf7eeu

/* Internal versions of the public tensor-returning functions: they return a reference the
 * caller owns and never register it with the thread's scope. Core code calls these; the
 * public em_X functions are em__scope_track(em__X(...)). */
em_tensor *em__empty(int ndim, const int64_t *shape, em_dtype dt, em_device dev);
em_tensor *em__full(int ndim, const int64_t *shape, double value, em_dtype dt, em_device dev);
em_tensor *em__view(const em_tensor *t, int ndim, const int64_t *shape);
em_tensor *em__reshape(const em_tensor *t, int ndim, const int64_t *shape);
em_tensor *em__expand(const em_tensor *t, int ndim, const int64_t *shape);
em_tensor *em__transpose(const em_tensor *t, int dim0, int dim1);
em_tensor *em__permute(const em_tensor *t, int ndim, const int *dims);
em_tensor *em__unsqueeze(const em_tensor *t, int dim);
em_tensor *em__squeeze(const em_tensor *t, int dim);
em_tensor *em__select(const em_tensor *t, int dim, int64_t index);
em_tensor *em__contiguous(const em_tensor *t);
em_tensor *em__clone(const em_tensor *t);
em_tensor *em__to_device(const em_tensor *t, em_device dev);
em_tensor *em__to_dtype(const em_tensor *t, em_dtype dt);
/* Run an op and return its first output as an owned reference (others released). */
em_tensor *em__op1(const em_op *op, const em_tensor *const *in, int n_in, const em_attr *attrs);
em_status em__op_call(const em_op *op, const em_tensor *const *in, int n_in,
                      const em_attr *attrs, em_tensor **out);
/* em_op_call_n without the scope. */
em_status em__op_call_n(const em_op *op, const em_tensor *const *in, int n_in,
                        const em_attr *attrs, em_tensor **out, int cap_out, int *n_out);
/* em_op_call_kernel without the scope. */
em_status em__op_call_kernel(const em_op *op, const em_tensor *const *in, int n_in,
                             const em_attr *attrs, em_tensor **out);
/* em_op_call_kernel's first output as an owned reference (composites reaching their own
 * kernel). */
em_tensor *em__kernel1(const em_op *op, const em_tensor *const *in, int n_in,
                       const em_attr *attrs);
/* The in-place form of op: self = op(in) with in[0] == self, under the op's own policy,
 * inference and checks (result type castable to self's dtype, shape equal to self's). */
em_status em__op_inplace(const em_op *op, em_tensor *self, const em_tensor *const *in,
                         int n_in, const em_attr *attrs);

/* The typed em_X() functions are one line each over these. */
#define EM__IN(...) ((const em_tensor *const[]){__VA_ARGS__})
#define EM__ATTRS(...) ((const em_attr[]){__VA_ARGS__})
#define EM__A_INT(x) ((em_attr){.type = EM_ATTR_INT, .v.i = (x)})
/* The seed attribute of a draw em__rng_draw made: absent for a graph capture's relative offset
 * (graph true), else the generator's seed. */
static inline em_attr em__rng_seed_attr(em_rng_state s, bool graph) {
    return graph ? (em_attr){.type = EM_ATTR_NONE} : EM__A_INT((int64_t)s.seed);
}
#define EM__A_FLOAT(x) ((em_attr){.type = EM_ATTR_FLOAT, .v.f = (x)})
#define EM__A_BOOL(x) ((em_attr){.type = EM_ATTR_BOOL, .v.b = (x)})
/* A string attribute, absent for NULL. */
#define EM__A_STR(x)                                                                            \
    ((x) ? (em_attr){.type = EM_ATTR_STRING, .v.s = (x)} : (em_attr){.type = EM_ATTR_NONE})
/* A float attribute from a possibly-NULL pointer (absent for NULL). */
#define EM__A_OPTF(p)                                                                           \
    ((p) ? (em_attr){.type = EM_ATTR_FLOAT, .v.f = *(p)} : (em_attr){.type = EM_ATTR_NONE})
/* An int attribute from a possibly-NULL pointer (absent for NULL). */
#define EM__A_OPTI(p)                                                                           \
    ((p) ? (em_attr){.type = EM_ATTR_INT, .v.i = *(p)} : (em_attr){.type = EM_ATTR_NONE})
/* An INT_LIST attribute over n int64s (borrowed). */
#define EM__A_LIST(cnt, ptr) ((em_attr){.type = EM_ATTR_INT_LIST, .n = (cnt), .v.list = (ptr)})
/* An INTS attribute from n ints (more than EM_MAX_DIMS or fewer than 0: n kept, and a NULL
 * array of n > 0 entries marked EM__INTS_NULL + n, for the dispatcher's check to name). */
em_attr em__attr_ints(int n, const int *v);
em_attr em__attr_ints64(int n, const int64_t *v);
/* Declares or defines a composite's body (em_op_schema.composite) named fn. */
#define EM__COMPOSITE(fn)                                                                       \
    static em_status fn(const em_op *op, const em_tensor *const *in, int n_in,                  \
                        const em_attr *attrs, em_tensor **out, int cap, int *n_out)
/* Attribute i of an op call, or def when the caller left it absent (NULL attrs, or a type
 * other than the one asked for: the schema has already checked the types given). */
static inline int64_t em__attr_int_or(const em_attr *a, int i, int64_t def) {
    return a && a[i].type == EM_ATTR_INT ? a[i].v.i : def;
}
static inline double em__attr_float_or(const em_attr *a, int i, double def) {
    return a && a[i].type == EM_ATTR_FLOAT ? a[i].v.f : def;
}
static inline bool em__attr_bool_or(const em_attr *a, int i, bool def) {
    return a && a[i].type == EM_ATTR_BOOL ? a[i].v.b : def;
}
#define EM__INTS_NULL (INT_MIN / 2)
/* Run op and return its first output in the thread's scope (NULL on error). */
#define em__call1(op, n_in, in, attrs) em__scope_track(em__op1((op), (in), (n_in), (attrs)))
/* Run op into out[0..n_out) (outputs a caller passes NULL for are released), in the scope. */
em_status em__callv(const em_op *op, int n_in, const em_tensor *const *in, const em_attr *attrs,
                    em_tensor **const *outs, int n_out);

/* A fresh tensor over new storage in category cat. */
em_tensor *em__tensor_new(int ndim, const int64_t *shape, em_dtype dt, em_device dev,
                          em_mem_category cat);
/* A new tensor object over t's storage (a view) with the given geometry. */
em_tensor *em__tensor_view(const em_tensor *t, int ndim, const int64_t *shape,
                           const int64_t *strides, int64_t offset);
/* Normalise dim for a tensor of ndim dims (negative counts from the end). Returns -1 and
 * sets EM_ERR_RANGE naming `who` when out of range. */
int em__wrap_dim(int dim, int ndim, const char *who);
bool em__is_contiguous(int ndim, const int64_t *shape, const int64_t *strides);
/* True when t's last two dims are a transposed view of a dense matrix (strides 1 and rows):
 * matmul backward then produces the grad in that layout, so a weight used through a transposed
 * view (linear) gets a contiguous grad the engine can keep without a copy. */
bool em__is_transposed_dense(const em_tensor *t);
/* em_tensor_is_channels_last on a geometry; a new uninitialised channels-last tensor of a
 * 4-dim shape; em_channels_last's internal form. */
bool em__is_channels_last(int ndim, const int64_t *shape, const int64_t *strides);
em_tensor *em__empty_channels_last(const int64_t *shape, em_dtype dt, em_device dev);
em_tensor *em__channels_last(const em_tensor *t);
em_tensor *em__to_layout(const em_tensor *t, em_layout l);
/* The first dim of size > 1 with stride 0 (several elements on one memory location: an
 * expanded view), or -1. */
int em__expanded_dim(const em_tensor *t);
void em__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
int64_t em__numel(int ndim, const int64_t *shape);
/* Fill a kernel view of t. */
void em__ktensor_fill(em_ktensor *k, const em_tensor *t);
/* t's storage's identity for em_kernel_ctx.storage_ids (taken at first use, never reused). */
uint64_t em__storage_id(const em_tensor *t);
/* Storage layouts (ember/tensor.h, em_layout). em__layout_of: t's storage layout (an atomic
 * load; 0 for almost every tensor). em__to_plain: convert t's storage to plain in place when
 * it is not (values and version unchanged; EM_ERR_NOMEM when no scratch memory). em__set_layout:
 * mark a fresh tensor's storage as holding layout l without converting anything (its bytes are
 * not yet written). em__layout_fits: whether a tensor of this shape and device can be held in
 * l. em__layout_preferred: the calling thread's em_layout_prefer. */
static inline int em__layout_of(const em_tensor *t) {
    return atomic_load_explicit(&t->storage->layout, memory_order_acquire);
}
em_status em__to_plain(const em_tensor *t);
/* t's first element in its storage, in whatever layout the storage is (no conversion). */
void *em__tensor_bytes(const em_tensor *t);
void em__set_layout(em_tensor *t, em_layout l);
bool em__layout_fits(int ndim, const int64_t *shape, em_device dev, em_layout l);
em_layout em__layout_preferred(void);
/* Count of live tensor objects (for the shutdown leak warning and tests). */
int64_t em__live_tensors(void);
/* Describe up to `few` live tensors ("[2, 3] float32, ...") into buf; returns how many are
 * live. For em_shutdown_checked: no other thread may make or free tensors meanwhile. */
int64_t em__tensors_describe_live(char *buf, size_t cap, int few);
/* Return every quarantined (freed, poisoned) tensor header to the host allocator. Same
 * condition as above. */
void em__tensors_quarantine_flush(void);
/* The same for the calling thread's heap only (any time: em_empty_cache). */
void em__tensors_quarantine_flush_thread(void);
/* Drop the reference that the scope opened at file:line held (counting t's scope_refs down):
 * em_tensor_release, remembering the scope if this frees the tensor. */
void em__tensor_release_scoped(em_tensor *t, const char *file, int line);
/* "[2, 3] float32" for t (live or quarantined) into buf; returns buf. */
const char *em__tensor_brief(const em_tensor *t, char *buf, size_t cap);

/* Live objects of the kinds other than tensors, counted where they are made and freed, so
 * that em_shutdown_checked can name what a program still holds. */
typedef enum em__live_kind {
    EM__LIVE_MODULE,
    EM__LIVE_OPTIMIZER,
    EM__LIVE_SCHEDULER,
    EM__LIVE_DATASET,
    EM__LIVE_LOADER,
    EM__LIVE_DICT,
    EM__LIVE_CONFIG,
    EM__LIVE_GENERATOR,
    EM__LIVE_N
} em__live_kind;
extern atomic_llong em__live_objects[EM__LIVE_N];
#define em__live_inc(kind) atomic_fetch_add_explicit(&em__live_objects[kind], 1, memory_order_relaxed)
#define em__live_dec(kind) atomic_fetch_sub_explicit(&em__live_objects[kind], 1, memory_order_relaxed)

/* ---- dispatch (dispatch.c) ---------------------------------------------------------------- */

void em__dispatch_init(void);
void em__dispatch_shutdown(void);

/* ---- autocast (autocast.c) ----------------------------------------------------------------- */

/* The inputs a classed op runs with under the thread's autocast region. */
typedef struct em__autocast_args {
    const em_tensor **args;  /* (n) the inputs to call the op with */
    em_tensor **held;        /* (n) the casts made for it (NULL where none) */
    const em_tensor *args_stack[8];
    em_tensor *held_stack[8];
    int n, was;
} em__autocast_args;
/* For op's call with in[0 .. n_in): 1 when the region casts something (a->args holds the
 * inputs, and the region is suspended until em__autocast_finish), 0 to run as called (nothing
 * to finish), -1 on error (set; nothing to finish). Called only with EM__OBS_AUTOCAST set. */
int em__autocast_enter(const em_op *op, const em_tensor *const *in, int n_in,
                       em__autocast_args *a);
void em__autocast_finish(em__autocast_args *a);
/* Clear the thread's autocast bit (the backward pass); resume with what suspend returned. */
int em__autocast_suspend(void);
void em__autocast_resume(int was);
/* Close the calling thread's regions and drop its cast cache (em_shutdown). */
void em__autocast_thread_exit(void);
void em__ops_remove_owner(em_registry *owner);
/* Checks that every input is non-NULL; when one is NULL sets an error only if none is
 * pending. Returns false if any is NULL. */
bool em__check_inputs(const char *op, const em_tensor *const *in, int n);
/* Records bytes copied between device types (placement report). */
void em__placement_count_copy(em_device dst, em_device src, size_t nbytes);
/* Fill a report record for kernel k (registry listings). */
void em__kernel_info(const em_kernel *k, em_kernel_info *out);
/* PyTorch's result_type over the inputs (0-dim tensors only raise the category). */
em_dtype em__result_type(const em_tensor *const *in, int n);
/* Whether any kernel of op is registered for (device type, dtype); a kernel's supports() may
 * still decline a call, which em_op_call_out then reports as EM_ERR_NOKERNEL before it runs
 * or records anything. No lock, no error set: a read of the stack's top, as dispatch does. */
bool em__op_has_kernel(const em_op *op, int device_type, em_dtype dt);

/* ---- standard ops (ops.c) ----------------------------------------------------------------- */

/* Declares the standard op set into the core registry at em_init(). */
em_status em__ops_declare_standard(em_registry *core);
/* The standard op set's case rows (core/op_cases.c), registered by em_init(). */
const struct em_op_case *em__op_cases_standard(size_t *n);
/* Remove the case rows owner registered (NULL: every row). */
void em__op_cases_remove_owner(const em_registry *owner);
/* Declare a single-output op of the standard set into the core registry. */
em_status em__declare_op(em_registry *core, const em_op **out, const char *name, int n_in,
                         int n_attrs, const char *const *attr_names, const em_attr_type *types,
                         int dispatch_arg, unsigned flags, em_infer_fn infer,
                         em_backward_fn backward, unsigned saves);
/* Declare a standard op from a schema literal (struct_size set, n_outputs 0 meaning 1). */
em_status em__declare(em_registry *core, const em_op **out, em_op_schema s);
/* A public reduction's attributes (attrs[0] dims as given, absent or empty for all; then the
 * op's others, keepdim last) into norm, dims normalised; errors name `who`. */
em_status em__reduce_attrs(const em_op *op, const char *who, const em_tensor *a,
                           const em_attr *attrs, int n_attrs, em_attr *norm);
/* Each op family declares its schemas (core/ops_<family>.c). */
em_status em__ops_declare_elementwise(em_registry *core);
em_status em__ops_declare_fill(em_registry *core);
em_status em__ops_declare_math(em_registry *core);
em_status em__ops_declare_reduce(em_registry *core);
em_status em__ops_declare_nn(em_registry *core);
em_status em__ops_declare_loss(em_registry *core);
em_status em__ops_declare_data(em_registry *core);
em_status em__ops_declare_linalg(em_registry *core);
em_status em__ops_declare_optim(em_registry *core);
em_status em__ops_declare_attention(em_registry *core);
em_status em__ops_declare_rnn(em_registry *core); /* ops_rnn.c */
/* ops_nn.c's preparation of an nn op's kernel call, shared with ops_attention.c: run op's own
 * kernel on t[0..n) (NULL: an absent optional input, passed as a 0-element tensor), each
 * input made contiguous in the kernel dtype ('x'), the statistics dtype ('s': f64 for f64,
 * f32 otherwise) or left in its dtype ('i'); f16/bf16 calls run natively where the device
 * has a kernel, else in f32. Results (owned) in the kernel dtype: em__nn_finish converts one
 * back (releasing it); em__nn_outputs hands n results to a composite's out (or releases them
 * when st is an error). */
em_status em__nn_call(const em_op *op, em_dtype dt, const em_tensor *const *t,
                      const char *roles, int n, const em_attr *attrs, em_tensor **res);
em_tensor *em__nn_finish(em_tensor *r, em_dtype dt);
em_status em__nn_outputs(em_status st, em_tensor **res, int n, em_tensor **out, int *n_out);

/* Handles to the standard ops, valid after em_init(). */
extern const em_op *em__op_copy, *em__op_fill;
/* Reduction dims (ops_reduce.c): normalise, sort and de-duplicate dims of a into an INTS
 * attr (all dims when ndims is 0), errors naming `who`; and drop the reduced dims of a
 * keepdim result r (consumed) unless keepdim. */
em_status em__reduce_dims(const char *who, const em_tensor *a, int ndims, const int *dims,
                          em_attr *attr);
em_tensor *em__reduce_drop(em_tensor *r, const em_attr *dims, bool keepdim);

/* ---- registries and plugins (plugin.c) ----------------------------------------------------- */

struct em_registry {
    char *name;
    /* What this registry registered, for reports and removal. */
    em_kernel **kernels;
    size_t n_kernels, cap_kernels;
    const em_op **ops;
    size_t n_ops, cap_ops;
    int device_types[EM_MAX_DEVICE_TYPES];
    size_t n_device_types;
};
em_registry *em__registry_new(const char *name);
void em__registry_free(em_registry *r);
em_status em__registry_add_kernel(em_registry *r, em_kernel *k);
void em__registry_forget_kernel(em_registry *r, const em_kernel *k);
em_status em__registry_add_op(em_registry *r, const em_op *op);
em_status em__registry_add_device_type(em_registry *r, int type);
/* The core's own registry (standard op schemas). */
em_registry *em__registry_core(void);
em_status em__registries_init(void);
void em__registries_shutdown(void);
/* EM_ERR_NOMEM when memory ran out (refused plugins are not an error). */
em_status em__plugins_load_all(void);
void em__plugins_unload_all(void);
/* "ember-cpu, ember-layers" (loaded plugins) for messages; static buffer per thread. */
const char *em__plugin_names(void);
/* Record where in a config file a module was built ("file:line:col"; NULL clears): its forward
 * errors then name that place (module.c's blame). EM_ERR_NOMEM. */
em_status em__module_set_where(em_module *m, const char *where);
/* Replace m's child `name` by child (freeing the old one; m owns child, also on failure):
 * ddp.c's SyncBatchNorm conversion. EM_ERR_NOTFOUND. */
em_status em__module_replace_child(em_module *m, const char *name, em_module *child);
/* The class registry (ember/plugin.h's em_class_*): em_class_register and em_class_find with
 * `who` naming the public function for messages ("module_class_register"; NULL for find: the
 * message then starts with "no ... class"). */
em_status em__class_register(em_registry *reg, const char *kind, const void *record,
                             const char *who);
const void *em__class_find(const char *kind, const char *name, const char *who);
/* The core kinds' own checks of a record (the core's copy, every field present), declared at
 * em_init() by plugin.c: module.c, optim.c, data.c. */
em_status em__module_class_check(const void *record, const char *who);
/* comm.c: the communicator kind's check. */
em_status em__comm_class_check(const void *record, const char *who);
/* em_comm_wait that also says when the collective completed (CLOCK_MONOTONIC seconds, as the
 * class saw it; -1 on failure), and that time for a work em_comm_test found complete (-1
 * before): ddp.c's bucket timings. */
typedef struct em_comm_work em_comm_work;
em_status em__comm_wait_at(em_comm_work *w, double *done_s);
double em__comm_work_done_s(const em_comm_work *w);
em_status em__optim_class_check(const void *record, const char *who);
em_status em__sched_class_check(const void *record, const char *who);
em_status em__dataset_class_check(const void *record, const char *who);
/* Sets and returns EM_ERR_NOTFOUND for a class lookup by name that failed: "WHO: no KIND class
 * named 'NAME' (did you mean 'X'?) is registered; registered: ...; loaded plugins: ...", and
 * the hint that a class of a plugin not loaded needs EMBER_PLUGIN_PATH. `who` may be NULL;
 * names: the n registered names of that kind. One message for every class kind. */
em_status em__class_not_found(const char *who, const char *kind, const char *name,
                              const char *const *names, size_t n);

/* ---- structs that cross the ABI (plugin.c) ------------------------------------------------ */

/* Every struct a caller fills or reads across the ABI starts with size_t struct_size, and a
 * caller built against older, smaller headers passes a smaller one. The prefix rule, the one
 * way every check in the core applies it: accept struct_size >= min, the size of the oldest
 * layout holding every field the core needs (EM__SIZE_THROUGH of the last such field, or
 * offsetof(T, ext) for "everything before the reserved pointer"); read only the bytes the
 * caller's struct_size covers, the rest zero (so a newer slot an older caller lacks reads
 * as NULL / 0 / false: its documented default). A larger struct_size (a caller built against
 * newer headers) is accepted and read up to what this core knows. Otherwise EM_ERR_INVALID
 * "who: T struct_size N is smaller than the oldest layout this core accepts (M bytes) ...". */
#define EM__SIZE_THROUGH(T, field) (offsetof(T, field) + sizeof(((T *)0)->field))
/* Read the caller's src into the core's own dst (size bytes): dst's struct_size becomes size. */
em_status em__struct_read(void *dst, size_t size, const void *src, size_t min, const char *who,
                          const char *type);
/* Write the core's full src (size bytes) into the caller's out: only the bytes out's
 * struct_size covers; out's struct_size is left as the caller set it. */
em_status em__struct_write(void *out, const void *src, size_t size, size_t min, const char *who,
                           const char *type);
#define EM__STRUCT_READ(T, dst, src, min, who)                                                  \
    em__struct_read((dst), sizeof(T), (src), (min), (who), #T)
#define EM__STRUCT_WRITE(T, out, src, min, who)                                                 \
    em__struct_write((out), (src), sizeof(T), (min), (who), #T)

/* ---- autograd (autograd.c) ------------------------------------------------------------------ */

/* Before a kernel runs: if grad mode is on and an input requires grad, build the node (edges,
 * saved inputs) into *node; check in-place rules on the outputs. *node stays NULL when nothing
 * is to be recorded. */
em_status em__autograd_pre(const em_op *op, const em_tensor *const *in, int n_in,
                           const em_attr *attrs, em_tensor *const *out, int n_out,
                           em__node **node);
/* After the kernel ran: attach the node to the outputs and save the outputs it needs. On
 * failure of the kernel call with ok = false: drop the node. */
em_status em__autograd_post(em__node *node, em_tensor *const *out, int n_out, bool ok);
/* Anomaly mode: check the floating outputs of op for NaN/Inf (forward). */
em_status em__anomaly_check_forward(const em_op *op, const em_tensor *const *in, int n_in,
                                    em_tensor *const *out, int n_out);
bool em__anomaly_on(void);
/* Record that `view` is a view of `base`: kind and parameters let backward map the view's
 * grad back to the base's shape. */
typedef enum em__view_kind {
    EM__VIEW_RESHAPE,  /* view, reshape, squeeze, unsqueeze, flatten: grad reshaped back */
    EM__VIEW_PERMUTE,  /* permute, transpose: inverse permutation; p = dims */
    EM__VIEW_EXPAND,   /* expand: grad summed over the expanded dims */
    EM__VIEW_NARROW,   /* narrow, slice, select: grad copied into zeros; dim, start, step,
                          and `squeezed` for select */
    EM__VIEW_STRIDED,  /* any view of a dense base, by its strides and offset in the base:
                          the history of a view whose base was changed in place */
} em__view_kind;
typedef struct em__view_info {
    em__view_kind kind;
    int dim;
    int64_t start, step;
    bool squeezed;
    int perm[EM_MAX_DIMS];
    int64_t strides[EM_MAX_DIMS], offset; /* EM__VIEW_STRIDED; offset from the base's */
} em__view_info;
/* Returns view, or NULL (view released) on failure. */
em_tensor *em__autograd_view(em_tensor *view, const em_tensor *base, const em__view_info *info);
/* Give the view node that made t (its grad_fn) the name of the op it belongs to: the dims a
 * reduction drops are part of that reduction (PyTorch's SumBackward), not a "view". */
void em__autograd_name_view(em_tensor *t, const char *name);
/* Record a cross-device copy (out = in moved to another device) for backward. */
em_status em__autograd_to_device(em_tensor *out, const em_tensor *in);
/* The count of autograd nodes made so far (process-wide), and the leaves that the nodes made
 * after `since` and reachable from t's history through such nodes lead to, with the name of
 * the node whose edge reaches each (the tracer's parameter gradient ops). */
uint64_t em__autograd_seq(void);
void em__autograd_leaf_edges(const em_tensor *t, uint64_t since,
                             void (*fn)(void *user, const em_tensor *leaf, const char *node),
                             void *user);
/* Free t's autograd state (grad, grad_fn, hooks) when t dies. */
void em__autograd_tensor_free(em_tensor *t);
void em__autograd_init(void);

/* ---- scopes (scope.c) --------------------------------------------------------------------- */

/* Give the user's new reference t to the thread's innermost scope (if any); returns t. */
em_tensor *em__scope_track(em_tensor *t);
void em__scope_shutdown(void);
/* Take t out of the innermost scope without moving it anywhere (the caller owns it). */
void em__scope_untrack(em_tensor *t);
/* em_tensor_release found every reference to t owned by open scopes: take one out of the
 * calling thread's innermost scope holding t, naming that scope's em_scope_begin site in
 * *file and *line. False when no scope of this thread holds t (another thread's does). */
bool em__scope_disown(em_tensor *t, const char **file, int *line);
/* Open scopes on the calling thread, and the innermost one's em_scope_begin site. */
int em__scope_open(const char **file, int *line);

/* ---- random (random.c) -------------------------------------------------------------------- */

void em__random_init(void);
void em__random_shutdown(void);

/* ---- errors, logging (error.c) ------------------------------------------------------------ */

bool em__error_pending(void);
void em__log_init(void);
/* Formatting helper: writes "[2, 3]" etc. */
const char *em__shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

/* ---- input files and safetensors reading (serialize.c) ------------------------------------ */

/* Open a file the user named, for reading, the one way every reader of the core does (a
 * plugin cannot call em__ functions; ember-data's dt_open_input does the same): anything but
 * a regular file (a FIFO, /dev/zero or another device, a socket, a directory) is refused
 * without blocking and without reading, since reading one can block forever or never end.
 * Returns the descriptor (O_RDONLY | O_CLOEXEC, blocking) and its size into *size (may be
 * NULL), or -1 with an error "<who>: cannot open '<path>': <reason>" (EM_ERR_NOTFOUND,
 * EM_ERR_IO) or "<who>: '<path>' is a FIFO (named pipe), not a regular file ..." (EM_ERR_IO). */
int em__input_open(const char *who, const char *path, uint64_t *size /* out, may be NULL */);
/* Exactly n bytes at file offset off into buf; EM_ERR_IO naming who, path and `what` for a
 * read error or a file that ends early (truncated while being read). */
em_status em__input_pread(int fd, const char *who, const char *path, void *buf, size_t n,
                          uint64_t off, const char *what);
/* A whole input file (em__input_open) into a new buffer (em__free), NUL-terminated; *len
 * excludes the NUL. Reads only the size the file had when opened. */
em_status em__input_read_all(const char *who, const char *path, char **out /* out */,
                             size_t *len /* out */);

/* A tensor of a safetensors header, as the reader validated it (borrowed from the reader). */
typedef struct em__st_entry {
    const char *key;
    em_dtype dtype;
    int ndim;
    const int64_t *shape; /* [ndim] */
} em__st_entry;
/* A load plan: sees every tensor of a file's header once the whole header is valid, and its
 * metadata, before any tensor data is read. It clears load[i] (all true on entry) for the
 * tensors not to read, or returns an error (set, naming the file) to refuse the file. */
typedef em_status (*em__load_plan_fn)(void *user, const em__st_entry *e, size_t n,
                                      const em_metadata *meta, bool *load);
/* em_load through a plan (NULL: read everything, which is em_load). */
em_status em__load_planned(const char *path, const em_load_options *opt, em__load_plan_fn plan,
                           void *user, em_dict **out, em_metadata **metadata_out);
/* The report of loading the entries whose keys start with prefix (NULL: all), prefix
 * stripped, into target: what em_dict_load_into would find, from a header alone. */
em_status em__load_report_entries(const em_dict *target, const em__st_entry *e, size_t n,
                                  const char *prefix, em_load_report **out /* out */);

/* ---- options and modules (options.c, module.c) -------------------------------------------- */

/* Levenshtein distance (case-insensitive) for did-you-mean hints; 1000 for names over 64. */
int em__edit_distance(const char *a, const char *b);

/* ---- checkpoint files (serialize.c) ------------------------------------------------------- */

/* Whether s is a run identity: 1 to EM_CHECKPOINT_RUN_ID_MAX - 1 of A-Z a-z 0-9 . _ : + @ -. */
bool em__checkpoint_run_id_valid(const char *s);
/* This host's name as temporary file names carry it: <= 32 of [A-Za-z0-9_-] (cap >= 33). */
void em__host_tag(char *buf, size_t cap);

/* ---- misc --------------------------------------------------------------------------------- */

uint64_t em__now_ns(void);

/* ---- spans for the profiler's trace (profile.c) -------------------------------------------- */

/* Set while a tracing profiler runs (process-wide): spans are recorded only then (one relaxed
 * load of a global and a branch when nothing traces). */
extern _Atomic int em__spans;
#define em__spanning() __builtin_expect(atomic_load_explicit(&em__spans, memory_order_relaxed) != 0, 0)
/* Record a span [t0, t1) (em__now_ns) named name in category cat, with one argument key:
 * sval when not NULL, else ival (key NULL: none), in the running tracing profiler's buffer of
 * the calling thread. */
void em__prof_span(const char *name, const char *cat, const char *key, const char *sval,
                   int64_t ival, uint64_t t0, uint64_t t1);
/* Name the calling thread in profiles and traces ("loader worker 0"; printf format, 31 bytes
 * kept). Unnamed threads are "main" (the process's first) or their pthread name. */
void em__thread_set_name(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The CPUs this process may use (the default thread count). */
#include "cpus.h"

#define EM__XSTR(x) #x
#define EM__STR(x) EM__XSTR(x)
#define EM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define EM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define EM_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif /* EMBER_INTERNAL_H */
