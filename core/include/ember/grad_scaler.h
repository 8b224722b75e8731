/*
 * ember/grad_scaler.h — the gradient scaler of mixed precision (PyTorch's
 * torch.amp.GradScaler): the loss is multiplied by a scale before backward so that float16
 * gradients do not underflow; the gradients are divided by it again (unscaled) before the
 * optimizer uses them; a step whose gradients hold an inf or NaN is skipped and the scale
 * backs off, and after growth_interval clean steps in a row it grows.
 *
 *     em_grad_scaler *sc = em_grad_scaler_new(NULL);           // PyTorch's defaults
 *     for (...) {
 *         em_autocast_begin("cpu", EM_F16);
 *         em_tensor *loss = ...forward and loss...;
 *         em_autocast_end();
 *         em_backward(em_grad_scaler_scale(sc, loss));
 *         em_grad_scaler_unscale_(sc, opt);                    // optional: before clipping
 *         em_clip_grad_norm_(params, 1.0, 2.0, false, NULL);   // clips the true gradients
 *         bool stepped;
 *         em_grad_scaler_step(sc, opt, &stepped);              // skipped on inf/NaN
 *         if (em_grad_scaler_update(sc) != EM_OK) break;       // overflowing at the floor
 *         em_optimizer_zero_grad(opt);
 *     }
 *     em_grad_scaler_free(sc);
 *
 * With bfloat16 (the CPU's autocast dtype) a scaler is not needed: bf16 has float32's range.
 *
 * The arithmetic is PyTorch's (_amp_update_scale_, step for step as torch.amp.GradScaler("cpu")
 * of PyTorch 2.x): the scale is a float32 value; unscaling multiplies by 1/scale computed in
 * double and rounded to float32; on a step with an inf/NaN gradient the scale becomes
 * scale * backoff_factor and the growth tracker 0; otherwise the tracker counts up and at
 * growth_interval the scale becomes scale * growth_factor (when that is finite) and the
 * tracker 0. The check and the unscaling are one fused list op per (device, dtype) of the
 * gradients, amp_unscale_ (core/ops_optim.c), with a kernel per device; its per-gradient
 * inf/NaN flags are the elements of one buffer, read back with one copy per (device, dtype):
 * one host synchronisation per step on a device with one dtype of gradients (PyTorch reads
 * its found_inf once per device), not one per gradient. em_grad_scaler_set_capturable (below)
 * keeps the whole state on the device instead, with no host read in the step, for a step
 * captured in a graph.
 *
 * Beyond PyTorch: a floor on the scale (min_scale, default 1). A backoff never takes the scale
 * below it, and when max_floor_skips steps in a row (default 10) are skipped at the floor,
 * em_grad_scaler_update fails (EM_ERR_RANGE) with the advice for a NaN loss — the gradients
 * overflow even unscaled, so skipping on would never train.
 *
 * State: em_grad_scaler_state_dict gives PyTorch's keys (scale, growth_factor, backoff_factor,
 * growth_interval, _growth_tracker) and Ember's (min_scale, max_floor_skips, skipped_steps,
 * floor_skips) as JSON; em_checkpoint saves it (em_checkpoint.scaler, metadata "amp.scaler"),
 * so a resumed run continues bit for bit.
 */
#ifndef EMBER_GRAD_SCALER_H
#define EMBER_GRAD_SCALER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/error.h"
#include "ember/export.h"
#include "ember/optim.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_grad_scaler em_grad_scaler;

typedef struct em_grad_scaler_options {
    size_t struct_size;      /* sizeof(em_grad_scaler_options) */
    double init_scale;       /* 65536 (2^16) */
    double growth_factor;    /* 2; must be > 1 */
    double backoff_factor;   /* 0.5; must be in (0, 1) */
    int64_t growth_interval; /* 2000; must be >= 1 */
    bool enabled;            /* true; false: scale() returns the loss, step() just steps */
    double min_scale;        /* 1: the floor (> 0, <= init_scale) */
    int64_t max_floor_skips; /* 10: skipped steps in a row at the floor before update fails */
    void *ext;               /* reserved; NULL */
} em_grad_scaler_options;
#define EM_GRAD_SCALER_OPTIONS_INIT                                                             \
    {.struct_size = sizeof(em_grad_scaler_options), .init_scale = 65536.0,                      \
     .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 2000, .enabled = true,     \
     .min_scale = 1.0, .max_floor_skips = 10}

/* A new scaler (free with em_grad_scaler_free); opt NULL: the defaults above. NULL on error:
 * EM_ERR_INVALID naming the option out of range. */
EM_API em_grad_scaler *em_grad_scaler_new(const em_grad_scaler_options *opt);
EM_API void em_grad_scaler_free(em_grad_scaler *s); /* NULL: nothing */

/* loss * scale (a new reference in the thread's scope; the loss itself when disabled).
 * NULL loss passes its error through. */
EM_API em_tensor *em_grad_scaler_scale(em_grad_scaler *s, const em_tensor *loss);
/* Divide the optimizer's gradients by the scale in place and record whether any is inf/NaN,
 * once per step (EM_ERR_STATE on a second call before em_grad_scaler_update, as PyTorch). */
EM_API em_status em_grad_scaler_unscale_(em_grad_scaler *s, em_optimizer *o);
/* Unscale (unless done) and step the optimizer, unless a gradient was inf/NaN (the step is
 * skipped). *stepped (may be NULL) says which. EM_ERR_STATE when called twice before update. */
EM_API em_status em_grad_scaler_step(em_grad_scaler *s, em_optimizer *o,
                                     bool *stepped /* out, may be NULL */);
/* Grow or back off the scale from this step's checks (every optimizer stepped since the last
 * update). EM_ERR_STATE when no unscale_/step recorded a check; EM_ERR_RANGE after
 * max_floor_skips skipped steps in a row at the floor (the message gives the advice). */
EM_API em_status em_grad_scaler_update(em_grad_scaler *s);

EM_API double em_grad_scaler_get_scale(const em_grad_scaler *s);   /* 1 when disabled */
EM_API int64_t em_grad_scaler_growth_tracker(const em_grad_scaler *s);
EM_API int64_t em_grad_scaler_skipped_steps(const em_grad_scaler *s); /* since creation/load */
EM_API bool em_grad_scaler_is_enabled(const em_grad_scaler *s);

/* Capturable (PyTorch's GradScaler with a capturable optimizer): from now on the scale, the
 * growth tracker, the skipped-step and floor-skip counts and the step's found-inf verdict are
 * 0-dim tensors on dev, and scale, unscale_, step and update queue device work only, with no
 * host read, so a training step with them can be captured in a graph and replayed
 * (em_graph_capture_begin, ember/device.h): the loss is multiplied by the scale tensor; the
 * gradients are checked by amp_unscale_ (its inv_scale 1, the flags left on the device) and
 * multiplied by 1/scale formed on the device (the host's arithmetic: the same bits); step saves
 * every parameter and optimizer state, steps, and puts the saved values back where an inf/NaN
 * was found (the step a no-op bit for bit, Adam's step count included; what an optimizer class
 * keeps outside its parameters and state tensors is not saved); update is
 * _amp_update_scale_ as device ops (the host's arithmetic, floor included). Until the
 * optimizer has stepped once (its states exist), step reads the verdict on the host as the
 * plain scaler does: run such first steps eagerly. Call when no capture is recording; dev
 * holds the optimizer's gradients. New in EMBER_1.1. */
EM_API em_status em_grad_scaler_set_capturable(em_grad_scaler *s, em_device dev);
/* After each step (after update, or after a replay of a captured step), outside a capture:
 * refreshes the host copies (get_scale, growth_tracker, skipped_steps, state_dict) from the
 * device with host reads, takes a step that was skipped on the device off o's count
 * (em_optimizer_steps; o may be NULL), says in *skipped (may be NULL) whether it was skipped,
 * and fails as update does (EM_ERR_RANGE) after max_floor_skips skips in a row at the floor.
 * Without set_capturable: *skipped for the last update, EM_OK. New in EMBER_1.1. */
EM_API em_status em_grad_scaler_read_step(em_grad_scaler *s, em_optimizer *o,
                                          bool *skipped /* out, may be NULL */);

/* The state as JSON (a new string, free with em_host_free). */
EM_API em_status em_grad_scaler_state_dict(const em_grad_scaler *s, char **json /* out */);
/* Restore from em_grad_scaler_state_dict's JSON (or PyTorch's keys alone). Checked before
 * anything changes: EM_ERR_FORMAT naming the key that is missing or out of range. */
EM_API em_status em_grad_scaler_load_state_dict(em_grad_scaler *s, const char *json);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_GRAD_SCALER_H */
