/*
 * cuda_mem.c — memory of the "cuda" device: device memory (cudaMalloc, under the core's
 * stream-aware caching allocator, which keeps the statistics by category), page-locked host
 * memory (cudaHostAlloc) for the loader's pin_memory, copies (cudaMemcpyAsync on the stream
 * the core names; complete on return when the default stream copies to or from the host) and
 * device synchronisation.
 */
#include "cuda_internal.h"

em_status cuda_dev_alloc(int index, size_t nbytes, void **out) {
    *out = NULL;
    em_status st = cuda_set_device(index);
    if (st != EM_OK) return st;
    cudaError_t e;
    if (__atomic_load_n(&cuda_captures, __ATOMIC_RELAXED)) {
        /* a graph capture may be recording on this thread: cudaMalloc is allowed in the
         * relaxed mode only (cuda_stream.c, graph capture) */
        enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
        (void)cudaThreadExchangeStreamCaptureMode(&m);
        e = cudaMalloc(out, nbytes);
        (void)cudaThreadExchangeStreamCaptureMode(&m);
    } else {
        e = cudaMalloc(out, nbytes);
    }
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* not sticky: clear it; the core empties its cache, retries
                                     and then reports what holds the memory */
        *out = NULL;
        return EM_ERR_NOMEM;
    }
    return cuda_check(e, "alloc", "cudaMalloc", index);
}

void cuda_dev_free(int index, void *ptr) {
    if (!ptr || cuda_set_device(index) != EM_OK) return;
    if (cuda_check(cudaFree(ptr), "free", "cudaFree", index) != EM_OK)
        em_log_write(EM_LOG_ERROR, "%s", em_last_error());
}

em_status cuda_host_alloc(size_t nbytes, void **out) {
    *out = NULL;
    cudaError_t e = cudaHostAlloc(out, nbytes, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) (void)cudaGetLastError();
    if (e != cudaSuccess) *out = NULL;
    return cuda_check(e, "host_alloc (page-locked memory)", "cudaHostAlloc", -1);
}

void cuda_host_free(void *ptr) {
    if (ptr && cuda_check(cudaFreeHost(ptr), "host_free", "cudaFreeHost", -1) != EM_OK)
        em_log_write(EM_LOG_ERROR, "%s", em_last_error());
}

static bool is_cuda(em_device d) { return d.type == cuda_device_type; }
static bool is_cpu(em_device d) { return d.type == EM_DEVICE_CPU_TYPE; }

em_status cuda_copy(em_device dd, void *dst, em_device sd, const void *src, size_t n,
                    em_stream *s) {
    char a[48], b[48];
    if (!(is_cuda(dd) || is_cpu(dd)) || !(is_cuda(sd) || is_cpu(sd)) || (is_cpu(dd) && is_cpu(sd)))
        return em_set_error(EM_ERR_DEVICE, "cuda: copy from %s to %s: the backend copies "
                            "between the host and cuda devices only",
                            em_device_str(sd, a, sizeof a), em_device_str(dd, b, sizeof b));
    int index = is_cuda(dd) ? dd.index : sd.index;
    em_status st = cuda_set_device(index);
    if (st != EM_OK) return st;
    cudaStream_t cs = s ? s->s : (cudaStream_t)0;
    cudaError_t e;
    const char *call;
    if (is_cuda(dd) && is_cuda(sd) && dd.index != sd.index) {
        e = cudaMemcpyPeerAsync(dst, dd.index, src, sd.index, n, cs);
        call = "cudaMemcpyPeerAsync";
    } else {
        e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, cs);
        call = "cudaMemcpyAsync";
    }
    char who[112];
    snprintf(who, sizeof who, "copy of %zu bytes from %s to %s", n,
             em_device_str(sd, a, sizeof a), em_device_str(dd, b, sizeof b));
    st = cuda_check(e, who, call, index);
    /* On the default stream a copy to or from the host is complete when it returns
     * (em_device_ops.copy); under EMBER_CUDA_SYNC=1 every copy is. */
    if (st == EM_OK && ((!s && (is_cpu(dd) || is_cpu(sd))) || cuda_sync_mode))
        st = cuda_check(cudaStreamSynchronize(cs), who, "cudaStreamSynchronize", index);
    return st;
}

em_status cuda_synchronize(int index) {
    em_status st = cuda_set_device(index);
    return st != EM_OK ? st : cuda_check(cudaDeviceSynchronize(), "synchronize",
                                         "cudaDeviceSynchronize", index);
}
