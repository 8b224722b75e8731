/*
 * ember/device.h — devices, the device-type table that backend plugins fill, streams, and the
 * per-device caching allocator with per-category memory statistics.
 *
 *     em_device dev;
 *     if (em_device_parse("cuda:1", &dev) != EM_OK)     // "no backend for device type 'cuda'
 *         puts(em_last_error());                         //  is loaded; installed plugins: ..."
 *     em_memory_summary(stdout);                         // what holds the memory, by category
 *
 * A backend registers a device type (em_device_type_register) with an em_device_ops table; the
 * core keeps one caching allocator per device on top of that table. Freed blocks stay cached
 * for reuse until em_empty_cache() hands them back to the device.
 *
 * The table may also give an execution context per (device, stream) — where the backend keeps
 * library handles bound to a stream; kernels reach it as em_kernel_ctx.exec (ember/dispatch.h)
 * — and named functions for settings only that backend has, found by name:
 *
 *     void (*set)(int) = (void (*)(int))em_backend_proc("cpu", "set_num_threads");
 *     if (set) set(4);                                   // what em_set_num_threads(4) does
 *
 * Memory categories. Every block is tagged with what it holds, so a summary can say who uses
 * the memory, not only how much. The rules:
 *   - module parameters                          -> EM_MEM_PARAMETER
 *   - a parameter's .grad                         -> EM_MEM_GRADIENT
 *   - optimizer state (momentum, Adam moments)    -> EM_MEM_OPTIMIZER
 *   - DataLoader batch buffers                    -> EM_MEM_DATA
 *   - scratch space kernels ask for               -> EM_MEM_WORKSPACE (em_kernel_workspace,
 *                                                    held for the length of one kernel call)
 *   - everything else (op outputs, user tensors)  -> EM_MEM_ACTIVATION
 * em_tensor_set_category() overrides the tag of a tensor's storage (all views share it).
 * Freed blocks kept for reuse count as EM_MEM_CACHED.
 *
 * Streams and the caching allocator (PyTorch's CUDA caching allocator rules). On a device
 * with streams, work queued on one stream runs in order, and work on different streams may
 * run in any order unless events order it. So the allocator ties each block to the stream it
 * was allocated on — the allocating thread's current stream on the device
 * (em_stream_current) — and a freed block goes back to that stream's own cache: the next
 * allocation on that stream may reuse it at once (its work there is ordered after the work
 * already queued on the block), an allocation on another stream never gets it while the
 * first stream's work may be pending. A tensor used on another stream too is declared with
 * em_tensor_record_stream(t, s): when t's storage is freed an event is recorded on each such
 * stream, and the block is reused only once all of them have completed (the allocator polls
 * them with event_query; without it, when the cache is emptied or a device allocation fails,
 * it waits for them). Such a waiting block counts as EM_MEM_CACHED.
 *
 *     em_stream *side;
 *     em_stream_create(dev, &side);
 *     em_stream_set_current(dev, side);   // this thread's work and allocations on dev: side
 *     em_tensor *h = em_relu(a);          // queued on side; h's block is side's
 *     em_event_record(dev, ev, side);
 *     em_stream_set_current(dev, NULL);
 *     em_event_wait(dev, NULL, ev);       // the default stream waits for side's relu
 *     em_tensor *y = em_add(h, b);        // on the default stream, reading h
 *     em_tensor_record_stream(h, NULL);   // so h's block waits for the default stream too
 *     em_tensor_release(h);               // reused once the add has run
 *
 * Copies between devices, or between a device and the host, run on the calling thread's
 * current stream of the device (for a copy between two devices, each half on its device's
 * current stream) and return once host memory may be read or reused; the host waits for
 * those streams only, not for the devices' other streams. Copies between streams of one
 * device are ordered by events, as above. The CPU has no streams: all of this costs it one
 * test per allocation and one per release.
 */
#ifndef EMBER_DEVICE_H
#define EMBER_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ember/error.h"
#include "ember/export.h"
#include "ember/random.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At most this many device types can be registered at once. */
#define EM_MAX_DEVICE_TYPES 16

/* A device: a registered type and an ordinal. Passed by value. */
typedef struct em_device {
    int16_t type;  /* index in the device-type registry; EM_DEVICE_CPU_TYPE is always "cpu" */
    int16_t index; /* ordinal within the type (cuda:1 -> 1); 0 for the CPU */
} em_device;

/* The CPU's device type is always registry slot 0 (reserved by the core, filled by the CPU
 * backend plugin). */
#define EM_DEVICE_CPU_TYPE 0
EM_API em_device em_cpu(void);

/* Parse "cpu", "cuda", "cuda:1", "testdev:0". A type that no loaded plugin registered is
 * EM_ERR_DEVICE naming the type and the installed plugins; an ordinal past the device count
 * is EM_ERR_DEVICE naming how many there are. */
EM_API em_status em_device_parse(const char *s, em_device *out /* out */);
/* "cpu" (the CPU device, index 0), "cuda:1" into buf (at least 32 bytes recommended); returns
 * buf. */
EM_API const char *em_device_str(em_device dev, char *buf, size_t cap);
EM_API bool em_device_equal(em_device a, em_device b);
/* Number of devices of a registered type name (0 when the type is not loaded). */
EM_API int em_device_count(const char *type_name);
/* Why a registered device type has no devices, in the backend's words (its count_reason
 * slot), e.g. "cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime
 * version"; NULL when the type has devices, gives no reason or is not loaded. Borrowed: valid
 * while the type stays registered. New in EMBER_1.1. */
EM_API const char *em_device_count_reason(const char *type_name);

typedef enum em_mem_category {
    EM_MEM_ACTIVATION = 0,
    EM_MEM_PARAMETER = 1,
    EM_MEM_GRADIENT = 2,
    EM_MEM_OPTIMIZER = 3,
    EM_MEM_DATA = 4,
    EM_MEM_WORKSPACE = 5,
    EM_MEM_CACHED = 6, /* freed, kept by the caching allocator for reuse */
    EM_MEM_CATEGORY_COUNT
} em_mem_category;

/* "activation", "parameter", "gradient", "optimizer", "data", "workspace", "cached". */
EM_API const char *em_mem_category_name(em_mem_category c);

typedef struct em_device_props {
    size_t struct_size;   /* sizeof(em_device_props), set by the caller: only the fields it
                             covers are written (the prefix rule, ember/plugin.h) */
    char name[128];       /* "Intel(R) Xeon(R) ...", "NVIDIA H100 ..." */
    size_t total_memory;  /* bytes; 0 when unknown */
    size_t free_memory;   /* bytes; 0 when unknown */
    int compute_units;    /* cores or SMs */
    /* ---- added in 1.1: written only when struct_size covers it ---- */
    char arch[32];        /* the backend's name for the device's architecture ("sm_90"),
                             "" when it has none */
} em_device_props;

/* Fill *out with the device's properties (the caller sets out->struct_size). Uses the
 * backend's properties slot; when the backend has none, only the name "<type>:<index>" is
 * filled and the rest is zero (unknown). EM_ERR_DEVICE for an unknown device, EM_ERR_INVALID
 * for a NULL out or a struct_size smaller than the 1.0 layout (through compute_units). */
EM_API em_status em_device_properties(em_device dev, em_device_props *out /* out */);

/* Opaque backend stream and event handles. NULL is the device's default stream, on which work
 * is ordered with everything else on that device. */
typedef struct em_stream em_stream;
typedef struct em_event em_event;

/*
 * The table a backend fills to register a device type. Optional slots may be NULL; each says
 * what NULL means. Grows only at the end; `struct_size` tells the core which slots exist.
 */
typedef struct em_device_ops {
    size_t struct_size;   /* sizeof(em_device_ops) as the plugin saw it */
    const char *name;     /* "cpu", "cuda": the prefix users write; [a-z][a-z0-9_]* */
    /* Number of devices of this type present now (the CPU: 1). */
    int (*count)(void);
    /* (optional) Fill props; NULL: only the name "<type>:<index>" is known. */
    em_status (*properties)(int index, em_device_props *props);
    /* Allocate nbytes (>0) of device memory, aligned to at least 64 bytes. On failure return
     * EM_ERR_NOMEM (the caller frees its cache and retries once). */
    em_status (*alloc)(int index, size_t nbytes, void **out);
    void (*free)(int index, void *ptr);
    /* (optional) Page-locked host memory for fast async copies; NULL: plain host memory. */
    em_status (*host_alloc)(size_t nbytes, void **out);
    void (*host_free)(void *ptr);
    /* Copy nbytes between host and device or within the device: exactly one of src/dst may be
     * host memory (its device is the CPU). Ordered on `stream` (NULL = default stream); with a
     * non-NULL stream the copy may still be running when this returns (the core then calls
     * stream_synchronize before it lets the host touch the memory); on the default stream
     * a copy to or from host memory is complete when it returns. */
    em_status (*copy)(em_device dst_dev, void *dst, em_device src_dev, const void *src,
                      size_t nbytes, em_stream *stream);
    /* Wait until all work on the device is done. */
    em_status (*synchronize)(int index);
    /* (optional) Streams and events; NULL: the device is synchronous and every stream is the
     * default one. With stream_create set, the caching allocator keeps a cache per stream
     * and needs event_create/event_record (or at least stream_synchronize) to honour
     * em_tensor_record_stream. An event stays valid after its stream is destroyed. */
    em_status (*stream_create)(int index, em_stream **out);
    void (*stream_destroy)(int index, em_stream *s);
    em_status (*stream_synchronize)(int index, em_stream *s);
    em_status (*event_create)(int index, em_event **out);
    void (*event_destroy)(int index, em_event *e);
    em_status (*event_record)(int index, em_event *e, em_stream *s);
    em_status (*event_wait)(int index, em_stream *s, em_event *e); /* s waits for e */
    em_status (*event_synchronize)(int index, em_event *e);
    void *ext; /* reserved; NULL */
    /* ---- added in 1.1: the core reads these only when struct_size covers them ---- */
    /* (optional) Make the backend's execution context for (device index, stream): what its
     * kernels need to run work on that stream — library handles bound to it (a BLAS or DNN
     * handle), settings. The core calls it once per (device, stream) on first use, keeps the
     * pointer in em_exec_ctx.backend (ember/dispatch.h), and hands it back to context_destroy
     * when the stream is freed (em_stream_free), the device type is removed or at
     * em_shutdown(). May run on any thread, never twice at once for one device type (both
     * slots run under the core's lock for the type: they must not allocate tensors or device
     * memory through the core). Return an error set with em_set_error (the op that needed it
     * fails with it). NULL: kernels see em_exec_ctx.backend NULL. */
    em_status (*context_create)(int index, em_stream *s, void **out /* out */);
    /* (optional) Free what context_create made; NULL: nothing to free. */
    void (*context_destroy)(int index, em_stream *s, void *ctx);
    /* (optional) The backend's named functions: settings and queries only this backend has
     * (the CPU backend's thread count), reached by name with em_backend_proc (ggml's
     * get_proc_address) and listed by ember-info. An array ended by an entry whose name is
     * NULL, which must outlive the registration. NULL: none. */
    const struct em_backend_fn_def *functions;
    /* (optional) Whether the work e marks has completed, without waiting (cudaEventQuery):
     * *done = true/false, EM_OK; an error status for an event never recorded or foreign.
     * The caching allocator polls it to reuse blocks other streams used (see "Streams and
     * the caching allocator" above). NULL: such blocks are reused only after
     * event_synchronize, when the cache is emptied or a device allocation fails. */
    em_status (*event_query)(int index, em_event *e, bool *done);
    /* (optional) When count() is 0, why, in words: the driver's or runtime's own message
     * ("cudaGetDeviceCount: no CUDA-capable device is detected"). The string must stay valid
     * while the type is registered. NULL, or a NULL result: no reason is known. The core
     * puts it in the error for a device of this type that does not exist
     * (em_device_parse("cuda")) and em_device_count_reason returns it. */
    const char *(*count_reason)(void);
    /* (optional) Make an event that also records when the device reaches it (a CUDA event
     * without cudaEventDisableTiming); recorded, waited on and destroyed with the event slots
     * above. The profiler's trace (ember/trace.h) times each op on such a device by a pair of
     * them. NULL: no timed events; the trace times the device's ops on the host, each
     * synchronised at its end. */
    em_status (*event_create_timed)(int index, em_event **out);
    /* (optional; needed with event_create_timed) *ns = the device time from timed event
     * `start` to timed event `end`, both recorded (cudaEventElapsedTime), waiting for `end`
     * to complete. An error status for an event not recorded or not timed. */
    em_status (*event_elapsed_ns)(int index, em_event *start, em_event *end, uint64_t *ns);
    /* (optional, all four or none) Graph capture (em_graph_capture_begin below; CUDA graphs):
     * graph_begin starts recording the work queued on stream s (never the default stream)
     * instead of running it; graph_end stops recording and returns the recorded work made
     * ready to run (cudaStreamEndCapture + cudaGraphInstantiate) as *graph, or an error that
     * names the call that broke the capture; graph_replay queues a whole recorded graph on s;
     * graph_destroy frees one (its last replay has completed: the core waited for it). While
     * s records, the core's allocator gives s's allocations from a pool of the graph's own and
     * never frees device memory (see "Graph capture" below): alloc may still be called and
     * must be safe to call while capturing. NULL: the device cannot capture; the core's
     * em_graph_* functions then fail with EM_ERR_DEVICE naming the device. */
    em_status (*graph_begin)(int index, em_stream *s);
    em_status (*graph_end)(int index, em_stream *s, void **graph /* out */);
    em_status (*graph_replay)(int index, void *graph, em_stream *s);
    void (*graph_destroy)(int index, void *graph);
} em_device_ops;

/* Any function pointer, as em_backend_proc returns it: cast it to the signature its entry
 * states before calling it. */
typedef void (*em_proc_fn)(void);

/* One named function of a backend (em_device_ops.functions). */
typedef struct em_backend_fn_def {
    const char *name;      /* "set_num_threads": [a-z][a-z0-9_]* */
    em_proc_fn fn;         /* the function, cast to em_proc_fn */
    const char *signature; /* its C type in words, for listings: "void (int n)" */
    const char *doc;       /* one line: what it does */
} em_backend_fn_def;

/* The named function `name` of the backend registered for device type `device_type`
 * ("cpu"), cast back by the caller to its documented signature:
 *     void (*set)(int) = (void (*)(int))em_backend_proc("cpu", "set_num_threads");
 *     if (set) set(4);
 * NULL with EM_ERR_NOTFOUND when no backend of that type is loaded (naming the loaded
 * plugins) or it has no such function (naming the ones it has). Valid while the backend's
 * plugin stays loaded. */
EM_API em_proc_fn em_backend_proc(const char *device_type, const char *name);
/* The named functions of a device type's backend, for listings: *n receives their count
 * (0 and NULL when the type is not loaded or has none). Borrowed, like em_backend_proc's. */
EM_API const em_backend_fn_def *em_backend_functions(const char *device_type,
                                                     size_t *n /* out */);

/* ---- memory ----------------------------------------------------------------------------- */

typedef struct em_memory_stats {
    size_t current[EM_MEM_CATEGORY_COUNT]; /* bytes held now, by category */
    size_t peak[EM_MEM_CATEGORY_COUNT];    /* the most held at once since the last reset */
    size_t count[EM_MEM_CATEGORY_COUNT];   /* live blocks now */
    size_t reserved;      /* bytes obtained from the device (in use + cached) */
    size_t peak_reserved;
    uint64_t device_allocs; /* calls to the device's alloc (cache misses) */
    uint64_t cache_hits;    /* allocations served from the cache */
} em_memory_stats;

/* Statistics of one device's allocator. EM_ERR_DEVICE for an unknown device. */
EM_API em_status em_memory_stats_get(em_device dev, em_memory_stats *out /* out */);
/* Print a table per device that has allocated anything: category, current, peak, blocks. */
EM_API void em_memory_summary(FILE *f);
/* Peaks restart from the current values, on every device. */
EM_API void em_memory_reset_peak(void);
/* Return every cached block to its device, and the freed tensor objects that the calling
 * thread's quarantine holds (ember/tensor.h, em_tensor_release) to the host allocator. */
EM_API void em_empty_cache(void);

/* Synchronize a device (wait for its queued work). */
EM_API em_status em_device_synchronize(em_device dev);

/* Streams and events, for backends with asynchronous queues. On a synchronous device (the
 * CPU) they exist and do nothing. em_stream_create may return a NULL stream with EM_OK, which
 * is the default stream. em_stream_free first waits for the work queued on the stream (when
 * the device has allocated anything): the blocks cached for that stream then serve the
 * default stream, and blocks that recorded it (em_tensor_record_stream) stop waiting for it.
 * em_event_wait(dev, s, e): work queued on s from now on runs after the work e marks. */
EM_API em_status em_stream_create(em_device dev, em_stream **out /* out */);
EM_API void em_stream_free(em_device dev, em_stream *s);
EM_API em_status em_stream_synchronize(em_device dev, em_stream *s);
EM_API em_status em_event_create(em_device dev, em_event **out /* out */);
EM_API void em_event_free(em_device dev, em_event *e);
EM_API em_status em_event_record(em_device dev, em_event *e, em_stream *s);
EM_API em_status em_event_wait(em_device dev, em_stream *s, em_event *e);
EM_API em_status em_event_synchronize(em_device dev, em_event *e);

/* The calling thread's current stream on a device (PyTorch's torch.cuda.stream): the stream
 * kernels and copies issued by this thread to `dev` run on. NULL (the default stream) until
 * em_stream_set_current sets it; each thread has its own. em_stream_set_current(dev, NULL)
 * restores the default stream. EM_ERR_DEVICE for an unknown device; EM_ERR_INVALID for a
 * non-NULL stream on a device without streams, or when this thread already holds current
 * streams on 16 other devices. em_stream_free of a thread's current stream makes that
 * thread's current stream the default again (other threads must stop using it first), and
 * frees the execution context the core made for that stream (ember/dispatch.h). */
EM_API em_status em_stream_set_current(em_device dev, em_stream *s);
EM_API em_stream *em_stream_current(em_device dev);

/* ---- graph capture ---------------------------------------------------------------------- */

/*
 * Graph capture (CUDA graphs; PyTorch's torch.cuda.graph): record the work a piece of code
 * queues on a device stream once, then replay all of it with one call, without the host-side
 * cost of each op (dispatch, autograd, launches). For steps whose shapes repeat, such as a
 * training step after its first steps.
 *
 *     em_stream *s;
 *     em_stream_create(dev, &s);
 *     ... run the step a few times eagerly (optimizer state, cuBLAS handles, cached blocks) ...
 *     em_graph *g;
 *     em_graph_capture_begin(dev, s);     // s becomes this thread's current stream on dev
 *     step(x_static, y_static);           // recorded on s, not run; tensors keep addresses
 *     em_graph_capture_end(dev, &g);      // the previous current stream is restored
 *     for (...) {
 *         em_copy_(x_static, next_x);     // new data into the same storage
 *         em_graph_replay(g);             // the whole step, queued on s
 *     }
 *     em_graph_free(g);                   // waits for its last replay
 *
 * Rules (those of CUDA graphs):
 *   - What a graph replays is the device work only, with the addresses, shapes and scalar
 *     arguments of the capture: host code (Python-like loops, em_item, a scheduler's new
 *     learning rate, an optimizer's step count passed as an argument) does not run again.
 *     Inputs change only through the contents of the storages the capture read; outputs
 *     land in the storages the capture wrote. Keep those tensors, and the stream, alive
 *     while the graph is.
 *     When a shape, a storage or a scalar argument changes, free the graph and capture again.
 *     Random numbers are the exception PyTorch makes too: the drawing ops (uniform_, normal_,
 *     bernoulli_, dropout, scaled_dot_product_attention's dropout) read their generator's
 *     state from device memory that each replay refills, so replays draw fresh numbers
 *     (ember/random.h, "Graph capture"); an op that draws otherwise (randperm) fails in a
 *     capture, naming itself.
 *   - During capture nothing runs: reading a value on the host (em_item, a copy to the CPU),
 *     synchronising, or a copy from host memory breaks the capture; em_graph_capture_end then
 *     fails naming the call (the backend's message) and the capture is discarded.
 *   - Memory (the capture-safe path of the caching allocator): while s records, the
 *     allocations of threads whose current stream on dev is s come from a pool owned by the
 *     graph. Blocks freed during the capture are reused within it (replays run in the same
 *     order); blocks of the pool freed after the capture stay in the pool, so nothing else can
 *     take memory a replay writes. The cache is not emptied while any stream of the device
 *     records (em_empty_cache skips that device; an out-of-memory error says so). The pool's
 *     cached blocks go back to the device's default cache at em_graph_free; blocks still held
 *     by live tensors follow when those are released.
 *   - One capture at a time per thread; the capturing thread must not change its current
 *     stream on dev until em_graph_capture_end.
 * Devices without graph capture (the CPU: its table has no graph slots) fail every call with
 * EM_ERR_DEVICE, "device cpu cannot capture graphs"; em_graph_capture_supported says so up
 * front. New in EMBER_1.1.
 */
typedef struct em_graph em_graph;

/* Whether dev's backend has the graph capture slots (false for an unknown device). */
EM_API bool em_graph_capture_supported(em_device dev);
/* Start recording the work queued on stream s of dev (s must not be NULL, the default
 * stream) and make s this thread's current stream on dev. EM_ERR_DEVICE when dev cannot
 * capture; EM_ERR_INVALID for the default stream; EM_ERR_STATE when this thread is already
 * capturing. */
EM_API em_status em_graph_capture_begin(em_device dev, em_stream *s);
/* Stop the capture this thread began on dev, restore its previous current stream, and give
 * the recorded graph in *out (NULL on error: the capture is discarded, its pool's blocks
 * return to the cache as they are released). EM_ERR_STATE when this thread is not capturing
 * on dev. */
EM_API em_status em_graph_capture_end(em_device dev, em_graph **out /* out */);
/* Queue the whole graph on the stream it was captured on; asynchronous like any op. A graph
 * whose ops draw random numbers first takes its blocks from its generator and writes the
 * generator's (seed, offset) into the device memory they read, on the same stream, so each
 * replay draws the numbers the same ops run eagerly would draw now (ember/random.h). */
EM_API em_status em_graph_replay(em_graph *g);
/* The generator the graph's drawing ops draw from (ember/random.h, "Graph capture") and the
 * Philox blocks each replay takes from it: *gen NULL and *blocks 0 when nothing in the graph
 * draws. The generator is borrowed: keep it alive while the graph is. EM_ERR_INVALID for a
 * NULL argument. New in EMBER_1.1. */
EM_API em_status em_graph_generator(const em_graph *g, em_generator **gen /* out */,
                                    uint64_t *blocks /* out */);
/* The stream a graph replays on (the one it was captured on). */
EM_API em_stream *em_graph_stream(const em_graph *g);
/* Wait for the graph's last replay, free it and hand its pool to the device's cache. */
EM_API void em_graph_free(em_graph *g);

/* ---- host memory, injectable ----------------------------------------------------------- */

/* The allocator the core (and the CPU backend) use for host memory: every core structure and
 * every CPU tensor's bytes. Replace it before em_init() — tests install one that fails the Nth
 * call to prove out-of-memory paths return EM_ERR_NOMEM and leak nothing. `alloc` returns
 * memory aligned to `align` (a power of two, >= sizeof(void*)) or NULL. */
typedef struct em_host_allocator {
    void *(*alloc)(size_t nbytes, size_t align, void *user);
    void (*free)(void *ptr, void *user);
    void *user;
} em_host_allocator;
/* NULL restores the default (posix_memalign/free). */
EM_API void em_host_allocator_set(const em_host_allocator *a);
/* Allocate through the current host allocator; NULL (and EM_ERR_NOMEM set) on failure. */
EM_API void *em_host_alloc(size_t nbytes, size_t align);
EM_API void em_host_free(void *ptr);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_DEVICE_H */
