/*
 * ember/tensor.h — the tensor: an opaque, reference-counted view (dtype, device, shape,
 * strides, offset) over reference-counted storage.
 *
 *     int64_t shape[2] = {2, 3};
 *     em_tensor *a = em_zeros(2, shape, EM_F32, em_cpu());
 *     em_tensor *b = em_transpose(a, 0, 1);     // a view: shares a's storage, shape [3, 2]
 *     em_tensor *c = em_view(b, 1, (int64_t[]){6});
 *         // NULL: "view: shape [3, 2] with strides [1, 3] is not compatible with a view of
 *         //  size [6]; use em_reshape() (which copies when it must)"
 *     em_tensor *d = em_reshape(b, 1, (int64_t[]){6});  // a contiguous copy
 *     em_tensor_print(stdout, d);
 *     em_tensor_release(d); em_tensor_release(b); em_tensor_release(a);
 *
 * Ownership. Every function that returns an em_tensor * returns a NEW reference that the
 * caller releases with em_tensor_release() — or that the enclosing em_scope_begin()/
 * em_scope_end() releases (ember/scope.h). Functions taking `const em_tensor *` borrow.
 *
 * Views versus copies (the seeds' warning). em_view, em_reshape (when the layout allows),
 * em_permute, em_transpose, em_narrow, em_slice, em_select, em_expand, em_squeeze,
 * em_unsqueeze and em_flatten return views: writing through one changes the other, and every
 * in-place write bumps the version counter shared by all views of the storage. em_clone,
 * em_contiguous (on a non-contiguous input), em_to_device, em_to_dtype and em_index_select
 * return copies. A tensor made by em_tensor_wrap shares the caller's memory (the C twin of
 * torch.from_numpy): the caller must keep it alive until the release callback runs.
 *
 * Dims may be negative (counted from the end, -1 is the last), as in PyTorch.
 */
#ifndef EMBER_TENSOR_H
#define EMBER_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ember/device.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EM_MAX_DIMS 8

typedef struct em_tensor em_tensor;

/* ---- lifetime ---------------------------------------------------------------------------- */

/* Add a reference; returns t (NULL stays NULL). */
EM_API em_tensor *em_tensor_retain(em_tensor *t);
/* Drop a reference; the last one frees the tensor (and its storage when no view is left).
 * NULL is a no-op. Misuse is caught rather than corrupting the heap; each case sets
 * EM_ERR_STATE (em_last_error) and logs the same message at EM_LOG_ERROR, naming the tensor's
 * shape and dtype:
 *   - every reference to t belongs to open scopes (t is a result made inside a scope and
 *     not em_keep'd or retained): the message names the file:line of the owning
 *     em_scope_begin; the release takes effect and that scope no longer drops t;
 *   - t is already freed — its scope ended and dropped it (the message names that scope's
 *     file:line), or it was released once too often: nothing happens. Freed tensor objects
 *     are poisoned and quarantined (per thread, the last 1,024 freed) before their memory
 *     is reused, so only a pointer that old goes unrecognised. */
EM_API void em_tensor_release(em_tensor *t);

/* ---- creation (each returns a new reference, NULL on error) ------------------------------ */

/* Uninitialised contents. shape may be NULL when ndim is 0 (a scalar). Dims must be >= 0;
 * zero-size dims are allowed. */
EM_API em_tensor *em_empty(int ndim, const int64_t *shape, em_dtype dt, em_device dev);
EM_API em_tensor *em_zeros(int ndim, const int64_t *shape, em_dtype dt, em_device dev);
EM_API em_tensor *em_ones(int ndim, const int64_t *shape, em_dtype dt, em_device dev);
EM_API em_tensor *em_full(int ndim, const int64_t *shape, double value, em_dtype dt,
                          em_device dev);
/* A 0-dim tensor holding `value` on the CPU. */
EM_API em_tensor *em_scalar(double value, em_dtype dt);
/* A tensor with the same shape, dtype and device as t. */
EM_API em_tensor *em_empty_like(const em_tensor *t);
EM_API em_tensor *em_zeros_like(const em_tensor *t);
/* Copy `numel(shape)` elements of dtype dt from the host buffer `data` (C order) into a new
 * tensor on dev. */
EM_API em_tensor *em_from_data(const void *data, int ndim, const int64_t *shape, em_dtype dt,
                               em_device dev);

/* Called when the last tensor over wrapped memory goes away. */
typedef void (*em_release_fn)(void *data, void *user);
/* Wrap memory the caller owns, without a copy. data must be aligned to the element size
 * (EM_ERR_INVALID otherwise). strides (in elements) may be NULL for C order.
 * `release` (may be NULL) is called once with (data, user) when no tensor uses the memory any
 * more. The memory counts in no allocator statistic. On error `release` is not called. */
EM_API em_tensor *em_tensor_wrap(void *data, int ndim, const int64_t *shape,
                                 const int64_t *strides, em_dtype dt, em_device dev,
                                 em_release_fn release, void *user);

/* ---- properties (borrowed; t must not be NULL) ------------------------------------------ */

EM_API em_dtype em_tensor_dtype(const em_tensor *t);
EM_API em_device em_tensor_device(const em_tensor *t);
EM_API int em_tensor_ndim(const em_tensor *t);
/* The shape and strides arrays (ndim entries, strides in elements); valid while t lives. */
EM_API const int64_t *em_tensor_shape(const em_tensor *t);
EM_API const int64_t *em_tensor_strides(const em_tensor *t);
/* Size and stride of one dim (negative dims allowed); -1 for a dim out of range. */
EM_API int64_t em_tensor_size(const em_tensor *t, int dim);
EM_API int64_t em_tensor_stride(const em_tensor *t, int dim);
/* Offset of the first element in the storage, in elements. */
EM_API int64_t em_tensor_offset(const em_tensor *t);
EM_API int64_t em_tensor_numel(const em_tensor *t);
/* numel * element size. */
EM_API size_t em_tensor_nbytes(const em_tensor *t);
/* True when the elements are laid out in C order without gaps (size-1 dims ignored). */
EM_API bool em_tensor_is_contiguous(const em_tensor *t);
/* True when t is channels-last: 4 dims (N, C, H, W) laid out densely in the order N, H, W, C
 * (strides H*W*C, 1, W*C, C; size-1 dims ignored except C's, whose stride must be 1), and not
 * also C-contiguous with C > 1. The convolutions, ReLU and max pooling keep this layout from
 * input to output on the CPU (docs/performance.md). New in 1.1. */
EM_API bool em_tensor_is_channels_last(const em_tensor *t);
/* Storage layouts (docs/performance.md, "Design (a)"). A tensor's shape and strides are
 * always its logical ones; its storage may hold the bytes in a kernel-private order that only
 * kernels declaring it (em_kernel_def.accepts_layouts, ember/dispatch.h) ever see.
 * EM_LAYOUT_NCHW16C is oneDNN's nChw16c: a dense 4-dim (N, C, H, W) tensor with C a multiple
 * of 16, stored as (N, C/16, H, W, 16), no padding (the same number of bytes as plain). Every
 * other access converts the storage back to plain first, in place and once: em_tensor_data,
 * the views (but an alias with the same geometry), copies, serialization, printing, and any
 * kernel that does not declare the layout. That conversion rewrites the storage's bytes, as
 * an in-place op does: a kernel reading the blocked bytes on another thread at that moment
 * races with it. New in 1.1. */
typedef enum em_layout { EM_LAYOUT_PLAIN = 0, EM_LAYOUT_NCHW16C = 1, EM_LAYOUT_COUNT } em_layout;
/* The layout of t's storage (EM_LAYOUT_PLAIN for almost every tensor). New in 1.1. */
EM_API em_layout em_tensor_layout(const em_tensor *t);
/* t's values in layout l: t itself (a new reference) when its storage has it, otherwise a new
 * tensor (a differentiable copy, like em_contiguous). EM_LAYOUT_NCHW16C needs a CPU tensor of
 * 4 dims with C a multiple of 16 (EM_ERR_SHAPE, EM_ERR_DEVICE otherwise). New in 1.1. */
EM_API em_tensor *em_to_layout(const em_tensor *t, em_layout l);
/* The calling thread's preferred layout for the 4-dim activations that layout-keeping ops
 * (the convolutions, ReLU, max pooling) make from plain inputs, when the device's kernel for
 * the call declares it and the shape allows it; returns the previous preference (start:
 * EM_LAYOUT_PLAIN). Outputs of such ops on an input already in a layout take that layout
 * regardless. Layers set it around their forward (Conv2d's memory_format: blocked). New in
 * 1.1. */
EM_API em_layout em_layout_prefer(em_layout l);
/* Address of the first element, in the tensor's device memory (host memory for the CPU). A
 * storage in a kernel-private layout is first converted to plain in place (NULL with the
 * error set when the scratch memory for that cannot be had). */
EM_API void *em_tensor_data(const em_tensor *t);
/* The storage's version counter: bumped by every in-place write through any view. */
EM_API uint64_t em_tensor_version(const em_tensor *t);
/* Record an in-place write done outside Ember's ops (e.g. through em_tensor_data()). */
EM_API void em_tensor_bump_version(em_tensor *t);
/* True when a and b share storage (one is a view of the other, or both of a third). */
EM_API bool em_tensor_shares_storage(const em_tensor *a, const em_tensor *b);
/* The memory category of t's storage (ember/device.h) and the way to change it. Changing it
 * moves the bytes between categories in the allocator statistics; wrapped memory has no
 * category and is EM_ERR_STATE. */
EM_API em_mem_category em_tensor_category(const em_tensor *t);
EM_API em_status em_tensor_set_category(em_tensor *t, em_mem_category c);
/* Declare that stream s of t's device uses t's memory too (PyTorch's record_stream): when
 * t's storage is freed, the caching allocator records an event on s and hands the block out
 * again only once that event has completed, i.e. once the work s had queued by then is done.
 * Without it a block goes back to the cache of the stream it was allocated on (the allocating
 * thread's current stream, em_stream_current) and is reused there at once, which is safe only
 * for work on that stream. Call it for every other stream that reads or writes t (a copy on a
 * side stream, a kernel after em_event_wait). Recording the allocation stream, or recording
 * twice, does nothing; on a device without streams (the CPU) it does nothing. s must be a
 * stream of t's device; em_stream_free(s) first waits for s, after which t no longer waits
 * for it. EM_ERR_INVALID for a NULL t, EM_ERR_STATE for wrapped memory (no allocator block),
 * EM_ERR_NOMEM when the record cannot grow. */
EM_API em_status em_tensor_record_stream(em_tensor *t, em_stream *s);
/* Shape as "[2, 3]" into buf; returns buf. */
EM_API const char *em_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

/* ---- views (share storage; new references) ---------------------------------------------- */

/* Same data, new shape; one dim may be -1 (inferred). Fails with EM_ERR_SHAPE when the
 * element count differs, and when t's strides cannot express the new shape without a copy
 * (then em_reshape is the answer, as in PyTorch). */
EM_API em_tensor *em_view(const em_tensor *t, int ndim, const int64_t *shape);
/* A view when the layout allows, otherwise a contiguous copy. */
EM_API em_tensor *em_reshape(const em_tensor *t, int ndim, const int64_t *shape);
/* dims is a permutation of 0..ndim-1 (negative allowed). */
EM_API em_tensor *em_permute(const em_tensor *t, int ndim, const int *dims);
EM_API em_tensor *em_transpose(const em_tensor *t, int dim0, int dim1);
/* Elements start..start+length-1 of dim. */
EM_API em_tensor *em_narrow(const em_tensor *t, int dim, int64_t start, int64_t length);
/* Python's t[start:end:step] along dim: negative start/end count from the end, both are
 * clamped to the size, step >= 1. */
EM_API em_tensor *em_slice(const em_tensor *t, int dim, int64_t start, int64_t end,
                           int64_t step);
/* t[index] along dim, removing the dim (index may be negative). */
EM_API em_tensor *em_select(const em_tensor *t, int dim, int64_t index);
/* Broadcast size-1 dims to `shape` (stride 0, no copy); -1 keeps a size; new leading dims
 * may be added. */
EM_API em_tensor *em_expand(const em_tensor *t, int ndim, const int64_t *shape);
/* Remove dim if it has size 1 (a no-op view otherwise, as in PyTorch). */
EM_API em_tensor *em_squeeze(const em_tensor *t, int dim);
/* Remove every size-1 dim. */
EM_API em_tensor *em_squeeze_all(const em_tensor *t);
/* Insert a size-1 dim at position dim (in [-ndim-1, ndim]). */
EM_API em_tensor *em_unsqueeze(const em_tensor *t, int dim);
/* Merge dims start..end into one (a view when possible, like em_reshape). */
EM_API em_tensor *em_flatten(const em_tensor *t, int start_dim, int end_dim);

/* ---- copies ------------------------------------------------------------------------------ */

/* t itself (a new reference) when contiguous, otherwise a contiguous copy. */
EM_API em_tensor *em_contiguous(const em_tensor *t);
/* t itself when channels-last (em_tensor_is_channels_last), otherwise a channels-last copy
 * (differentiable, like em_contiguous); EM_ERR_SHAPE unless t has 4 dims. New in 1.1. */
EM_API em_tensor *em_channels_last(const em_tensor *t);
/* Always a new contiguous copy on the same device. */
EM_API em_tensor *em_clone(const em_tensor *t);
/* A copy on dev (t itself when already there). */
EM_API em_tensor *em_to_device(const em_tensor *t, em_device dev);
/* A copy of t on dev, queued on `stream` and possibly still running when this returns
 * (PyTorch's t.to(dev, non_blocking=True)); a new tensor (never t itself), recorded by autograd
 * like em_to_device. New in EMBER_1.1.
 *   Which copies: host to device, device to host, or within one device; `stream` is a stream
 *   of that device (NULL: its default stream, on which a copy to or from the host is
 *   complete when this returns — pass a stream to overlap). Between two devices use
 *   em_to_device; host to host takes NULL and copies at once.
 *   Ordering: the copy runs after the work queued on `stream` so far, and not after other
 *   streams' work: make `stream` wait (em_event_wait) for the work that writes t first. The
 *   result's memory belongs to `stream` (the caching allocator's rule, ember/device.h): work
 *   on another stream must wait for an event recorded on `stream` after this call before it
 *   reads the result, and declare its use with em_tensor_record_stream.
 *   Lifetime: t may be released at once. A host source is kept alive (a reference) until
 *   the copy has run — dropped by the next em_to_device_async once its event completed, by
 *   em_device_synchronize, or at em_shutdown — but must not be WRITTEN until then (wait
 *   with em_stream_synchronize or an event). A device source's block is recorded on
 *   `stream` (em_tensor_record_stream), so it is not reused before the copy. A result in
 *   host memory must not be read before the copy has completed. Page-locked host memory
 *   (the loader's pin_memory buffers) lets the device copy without staging.
 *   A non-contiguous t is first made contiguous (on the host at once, on a device on
 *   `stream`). Errors: EM_ERR_DEVICE for two different devices or an unknown device,
 *   EM_ERR_INVALID for a stream on a host-to-host copy; NULL is returned. */
EM_API em_tensor *em_to_device_async(const em_tensor *t, em_device dev, em_stream *stream);
/* A copy converted to dt (t itself when already dt). Floating to integer truncates toward
 * zero; to f16/bf16 rounds to nearest even; to bool is "!= 0". */
EM_API em_tensor *em_to_dtype(const em_tensor *t, em_dtype dt);
/* Copy src into dst in place: src broadcasts to dst's shape, converts to dst's dtype, and may
 * be on another device. Bumps dst's version. */
EM_API em_status em_copy_(em_tensor *dst, const em_tensor *src);

/* The value of a one-element tensor (any shape with numel 1) as a double, copied to the host.
 * Holds on to nothing. On error returns NaN and sets the last error; em_tensor_item tells the
 * two apart. */
EM_API double em_item(const em_tensor *t);
EM_API em_status em_tensor_item(const em_tensor *t, double *out /* out */);
/* Copy all elements, in C order, to a host buffer of numel * element size bytes. */
EM_API em_status em_tensor_to_host(const em_tensor *t, void *dst, size_t cap);

/* ---- printing ---------------------------------------------------------------------------- */

/* Print like PyTorch: values with a common precision, large tensors summarised with "...",
 * then dtype (when not float32), device (when not the CPU) and shape, e.g.
 *     tensor([[ 0.1000, -2.0000],
 *             [ 3.5000,  4.0000]], shape=[2, 2])
 * Returns EM_OK or an error (bad stream, device copy failure). */
EM_API em_status em_tensor_print(FILE *f, const em_tensor *t);
/* The same text into buf (always NUL-terminated when cap > 0). Returns the length the full
 * text needs (like snprintf), or 0 and sets the error on failure. */
EM_API size_t em_tensor_format(const em_tensor *t, char *buf, size_t cap);

typedef struct em_print_options {
    int precision; /* digits after the point for floats (default 4) */
    int64_t threshold; /* summarise when numel exceeds this (default 1000) */
    int edgeitems;     /* items shown at each end of a summarised dim (default 3) */
    int linewidth;     /* wrap rows longer than this (default 80) */
} em_print_options;
/* Process-wide, like torch.set_printoptions. NULL restores the defaults. */
EM_API void em_print_options_set(const em_print_options *opt);
EM_API em_print_options em_print_options_get(void);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_TENSOR_H */
