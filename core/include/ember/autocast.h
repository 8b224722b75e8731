/*
 * ember/autocast.h — mixed precision: autocast regions.
 *
 * Inside an autocast region the op calls of the calling thread run each op under its declared
 * autocast class (em_op_schema.autocast, ember/dispatch.h): matrix products and convolutions
 * in the region's lower-precision dtype (bfloat16 on the CPU, where AVX512_BF16 runs oneDNN's
 * bf16 GEMM at about twice its f32 rate), the numerically sensitive ops (softmax, norms,
 * losses, exp/log, sums) in float32, and a few multi-input ops at the widest input dtype. The
 * parameters stay float32 (the "master weights"): a region never changes a tensor, it casts
 * copies of the inputs for the op it calls, and the gradient of a float32 parameter comes back
 * in float32 through the cast's derivative. The fused optimizer kernels are unchanged.
 *
 *     em_autocast_begin("cpu", EM_BF16);      // forward and loss in the region
 *     em_tensor *logits = em_module_forward(model, x);   // linear/conv: bf16 outputs
 *     em_tensor *loss = em_cross_entropy(logits, y, NULL, EM_REDUCTION_MEAN, -100, 0.0);
 *     em_autocast_end();                      // float32 loss
 *     em_backward(loss);                      // outside the region, as PyTorch recommends
 *     em_optim_step(opt);                     // float32 weights, float32 grads
 *
 * Rules:
 *   - Regions are per thread and nest; the innermost region for a device type decides.
 *     em_autocast_begin_disabled() opens a region in which the ops of every device type run as
 *     called (torch.autocast(enabled=False) inside an enabled one); its end restores the
 *     outer region.
 *   - Only floating inputs of float32, float16 or bfloat16 on the region's device type are
 *     cast; float64, integer and bool inputs, and tensors on other devices, never are.
 *   - The class applies where the op is called (em_op_call, em_op_call_n and every typed
 *     em_X()): the op then runs with the region suspended, so the ops a classed composite is
 *     made of (linear's matmul, log_softmax's exp) run as the composite calls them. An op of
 *     class NONE runs as called, and the ops inside it (a composite) still see the region.
 *     em_op_call_out, em_op_call_kernel, in-place calls (em_add_, ...) and list ops are not
 *     autocast (PyTorch has no autocast for out= and in-place forms either).
 *   - Backward passes (em_backward, em_grad) run with the region suspended: every derivative
 *     runs in the dtype its forward ran in, and a gradient is returned in its leaf's dtype.
 *   - Casts of parameters (leaf tensors that require grad) to the region's lower dtype are
 *     cached until the outermost region ends, so a weight used several times per step is cast
 *     once; an entry is made again when the parameter's version changes (an optimizer step,
 *     em_copy_ into it) or when grad mode differs from the one the cast was made under. The
 *     cache holds references to the parameters and their casts until then: end every region.
 *   - Under float16 on the CPU the lower-precision ops run the CPU's f16 kernels (f32 compute
 *     where there is no native f16 kernel): correct but slow there; use bfloat16 on the CPU.
 *     On CUDA (CUDA part 2) the same regions will take float16 and bfloat16.
 *
 * The standard ops' classes. They follow PyTorch 2.x's CPU autocast lists
 * (aten/src/ATen/autocast_mode.cpp), restricted to the ops Ember has; CPU autocast's lists
 * changed between 1.13 and 2.x, and these are 2.x's (checked against PyTorch 2.15.0 by
 * tests/test_autocast, from the probes of tests/fixtures/gen_autocast.py). Entries marked [+]
 * are not in PyTorch's CPU lists: the float32 ones are the numerically sensitive ops that
 * PyTorch keeps in float32 on CUDA but runs in bfloat16 on the CPU (Ember keeps them in
 * float32 on every device, as the seeds advise); the promote ones promote by their own dtype
 * rule in PyTorch (and in Ember, EM_OP_PROMOTE), and the class makes that explicit
 * (scatter_add is in PyTorch's CUDA promote list); the lower one, conv2d_relu, is Ember's fused
 * op, conv2d then relu, which PyTorch runs with conv2d lower. An op not listed is NONE.
 * tests/test_autocast reads these lists from this header.
 *
 * <autocast-lists>
 * lower: conv1d conv2d conv2d_relu[+] conv_transpose2d bmm addmm matmul linear
 *   scaled_dot_product_attention
 * float32: cross_entropy nll_loss mse_loss l1_loss smooth_l1_loss
 *   binary_cross_entropy_with_logits prod softmax[+] log_softmax[+] layer_norm[+]
 *   group_norm[+] batch_norm[+] exp[+] log[+] log1p[+] expm1[+] pow[+] pow_scalar[+]
 *   rsqrt[+] reciprocal[+] erfinv[+] sum[+] mean[+] logsumexp[+] norm[+]
 * promote: cat stack scatter_add[+] where[+] add[+] sub[+] mul[+] div[+] maximum[+]
 *   minimum[+]
 * </autocast-lists>
 *
 * batch_norm is float32 because Ember's batch_norm kernels compute its statistics in the
 * input's dtype (PyTorch's CPU kernel takes bf16 input with float32 statistics inside).
 *
 * Parameters stored in bfloat16/float16 by the user (em_module_to_dtype) are a different
 * thing: there the fused optimizers keep float32 master weights in their state
 * ("master_param", ember/optim.h) and the model computes in the stored dtype everywhere;
 * under autocast the parameters themselves stay float32 and only the listed ops compute in
 * the lower dtype. Use one or the other, not both.
 */
#ifndef EMBER_AUTOCAST_H
#define EMBER_AUTOCAST_H

#include <stdbool.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Open an enabled region on the calling thread for tensors of device_type ("cpu", "cuda")
 * with lower-precision dtype EM_BF16 or EM_F16. Errors: EM_ERR_NOTFOUND for an unregistered
 * device type; EM_ERR_DTYPE for another dtype; EM_ERR_RANGE past 64 nested regions. */
EM_API em_status em_autocast_begin(const char *device_type, em_dtype dtype);
/* Open a region in which no op is autocast (every device type), until its em_autocast_end.
 * EM_ERR_RANGE past 64 nested regions. */
EM_API em_status em_autocast_begin_disabled(void);
/* Close the innermost region; the outermost one's end drops the parameter cast cache.
 * EM_ERR_STATE when the thread has no open region. */
EM_API em_status em_autocast_end(void);
/* Whether an enabled region applies to ops on device_type now, and its dtype (*dtype may be
 * NULL; unchanged when false). */
EM_API bool em_autocast_enabled(const char *device_type, em_dtype *dtype /* out */);
/* The number of parameter casts held in the thread's cache (for tests and reports). */
EM_API int em_autocast_cache_size(void);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_AUTOCAST_H */
