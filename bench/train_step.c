/*
 * train_step.c — Ember's side of the training-step rows of bench/compare-pytorch.py (issue
 * 3's workloads): a worker that reads workload names on stdin, one a line, runs one timed
 * batch of training steps and prints "name ms_per_step" followed by the time of each step of
 * the batch in ms (the driver interleaves these calls with PyTorch's and reports the spread of
 * single steps). `bench/train_step --list` prints the workloads.
 *
 *   train_mlp_b128  MLP 784-512-256-10 (linear, ReLU, linear, ReLU, linear), batch 128
 *   train_mlp_b128_clip  the same step with em_clip_grad_norm_(params, 1.0, 2, false) between
 *                   backward and the optimizer step (its norm read on the host, as
 *                   torch.nn.utils.clip_grad_norm_ returns it); not a row of
 *                   compare-pytorch.py's default set, run when named
 *   train_cnn_b64   conv(1->32, 3x3, pad 1), ReLU, max_pool 2, conv(32->64, 3x3, pad 1), ReLU,
 *                   max_pool 2, flatten, linear(3136->128), ReLU, linear(128->10); batch 64
 *                   of 1x28x28; the activations channels-last up to the flatten (the input
 *                   made so each step, as a Conv2d with memory_format: channels_last does);
 *                   each conv and its ReLU one conv2d_relu (the fused op a Conv2d with
 *                   activation: relu calls). PyTorch's side stays NCHW Conv2d then ReLU:
 *                   the same model and values
 *   train_cnn_b64_blocked  the same model in Ember's fastest configuration: the activations
 *                   in the nChw16c storage layout (ember/tensor.h, em_layout) from conv1's
 *                   output to the flatten (Conv2d layers with memory_format: blocked), each
 *                   ReLU inside the pooling after it (max_pool2d_relu: a MaxPool2d with
 *                   activation: relu after a Conv2d without one)
 *   train_cnn_b64_traced  the same CNN step recorded by the forward-graph tracer: each step
 *                   between em_trace_begin and em_trace_end (then em_trace_free), for the
 *                   tracer's overhead against train_cnn_b64 in the same process
 *   train_transformer_b32  issue 25's: the layer class TransformerEncoder (2 layers, d_model
 *                   256, 4 heads, dim_feedforward 1024, dropout 0.1, ReLU, post-norm,
 *                   batch_first) on x (32, 128, 256) uniform on [0, 1), loss mse against a
 *                   fixed target N(0, 1) of the same shape; the layers' default
 *                   initialisation (PyTorch's)
 *   train_lstm_h256 issue 25's: a one-layer LSTM (input 256, hidden 256, the fused lstm op as
 *                   the LSTM layer calls it: weight [W_ih | W_hh], bias b_ih + b_hh) over a
 *                   sequence of 64 steps, batch 32, then linear(256->64) at every step and
 *                   cross_entropy over the 64 x 32 steps (a character model's step)
 *   train_gru_h256  the same with a one-layer GRU (the fused gru op, weight [W_ih | W_hh],
 *                   biases b_ih and b_hh; PyTorch: nn.GRU(256, 256)); not a row of
 *                   compare-pytorch.py's default set, run when named
 *   train_cnn_b64_profiled  the same CNN step under the op profiler (em_profiler_begin
 *                   without a trace, em_profiler_end, em_profiler_free each step):
 *                   ember-train --profile's cost
 *   train_cnn_b64_chrometrace  the same under a tracing profiler (options.trace), its Chrome
 *                   trace written to /dev/null after each step: ember-train --trace's cost
 *                   (recording and writing every event once)
 *   train_cnn_b64_bf16  the same CNN step with forward and loss in a bf16 autocast region
 *                   (ember/autocast.h; PyTorch: torch.autocast("cpu", torch.bfloat16)),
 *                   float32 parameters, gradients and Adam
 *
 * `bench/train_step --cpu-time` times the same requests in CPU time of the whole process
 * (CLOCK_PROCESS_CPUTIME_ID: every thread's, OpenMP workers included) instead of wall time,
 * same output: on a machine shared with other jobs the wall time of a step is mostly how long
 * it waited for a core, its CPU time is the work it did (what before/after decisions on that
 * machine go by; bench/compare-pytorch.py --cpu-time runs it so, bench/README.md says where
 * it was used).
 * `bench/train_step --profile NAME [steps]` runs one untimed step, then `steps` (default 50)
 * under one op profiler (em_profiler_begin) and prints its report (em_profiler_report: each
 * op's calls, total and self time over those steps) and the mean step (issue 27: where a step
 * spends its time beyond its GEMM floor).
 *
 * `bench/train_step --calls NAME [steps]` runs one untimed step, then `steps` (default 50)
 * with an op observer on the calling thread that times every call running a kernel (not the
 * composites around them, not views) and prints, per call site of the step (the op and its
 * inputs' shapes and strides, in the order the step first runs them), the calls per step, the
 * median and mean wall ms per call and the median CPU ms of the process per call (every
 * thread's; a call nested in another, such as an op's dtype casts, has its own row and is also
 * inside its caller's time), how many threads ran during the call (median; a thread ran when
 * its CPU time grew by 2 us or more), the calling thread's CPU and the other threads' CPU per
 * call (medians; every other thread of the process, listed after the warm-up step: OpenMP's
 * workers, OpenBLAS's pool; the caller's interval holds the reads of the process's clock, so
 * it can exceed the process's CPU for a short call), then the CPU plugin's GEMM decisions
 * (em_plugin_describe): each GEMM inside the step, to set beside bench/step_floor's
 * (--cpu-time) row of the same shape timed alone, and what the rest of the step costs (issue
 * 27).
 * `bench/train_step --memory NAME...` instead prints, per workload, the activation bytes of
 * one step from the allocator's statistics (em_memory_stats: category activation): what the
 * forward and loss hold when backward starts (the tensors autograd saved, and the outputs), and
 * the step's peak, each above what the inputs hold (issue 21: f32 against bf16 autocast).
 *
 * One step is what a training loop does: forward, cross_entropy (mean), em_backward, then
 * em_optimizer_step of an "Adam" optimizer made by name from the registry with its default
 * options (lr 1e-3, betas 0.9/0.999, eps 1e-8: torch.optim.Adam's defaults) over every
 * parameter, and em_optimizer_zero_grad (grads set to none). The batch stays the same (data
 * loading is not measured). Parameters
 * are initialised like PyTorch's defaults (uniform on +-1/sqrt(fan_in)); inputs uniform on
 * [0, 1), labels uniform in [0, 10). The first request of a workload builds it and runs one
 * untimed step (oneDNN primitive creation, allocator cache, page faults).
 */
#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ember/ember.h>

static clockid_t step_clock = CLOCK_MONOTONIC; /* --cpu-time: CLOCK_PROCESS_CPUTIME_ID */

static double now_ms(void) {
    struct timespec t;
    clock_gettime(step_clock, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static void die(const char *what) {
    fprintf(stderr, "train_step: %s: %s\n", what, em_last_error());
    exit(1);
}

/* A parameter of the given shape, uniform on +-1/sqrt(fan_in), requiring grad. */
static em_tensor *param(int ndim, const int64_t *shape, int64_t fan_in) {
    em_tensor *t = em_empty(ndim, shape, EM_F32, em_cpu());
    double b = 1.0 / sqrt((double)fan_in);
    if (!t || em_uniform_(t, -b, b, NULL) != EM_OK || em_requires_grad_(t, true) != EM_OK)
        die("parameter");
    return t;
}

typedef struct workload {
    const char *name;
    int iters; /* steps per timed batch */
    bool cnn, traced, transformer, lstm, gru, amp, clip, blocked;
    int profiled; /* 1: the op profiler; 2: with its trace, written out */
    int64_t batch;
    int np;
    em_tensor *p[8], *x, *y;
    em_dict *opt_params; /* clip: the parameters by name */
    em_module *model; /* transformer */
    em_optimizer *opt;
    bool ready;
} workload;

static void setup_transformer(workload *w) {
    em_options *o = em_options_new();
    em_options_set_int(o, "d_model", 256);
    em_options_set_int(o, "nhead", 4);
    em_options_set_int(o, "dim_feedforward", 1024);
    em_options_set_float(o, "dropout", 0.1);
    em_options_set_bool(o, "batch_first", true);
    em_options_set_int(o, "num_layers", 2);
    w->model = em_module_new("TransformerEncoder", o);
    em_options_free(o);
    if (!w->model) die("TransformerEncoder");
    const int64_t shape[3] = {w->batch, 128, 256};
    w->x = em_empty(3, shape, EM_F32, em_cpu());
    w->y = em_empty(3, shape, EM_F32, em_cpu());
    if (!w->x || !w->y || em_uniform_(w->x, 0, 1, NULL) != EM_OK ||
        em_normal_(w->y, 0, 1, NULL) != EM_OK)
        die("input");
    em_dict *params = em_module_named_parameters(w->model, true);
    w->opt = params ? em_optimizer_new("Adam", params, NULL) : NULL;
    if (!w->opt) die("optimizer");
    em_dict_free(params);
}

enum { LSTM_T = 64, LSTM_I = 256, LSTM_H = 256, LSTM_V = 64 };

static void setup(workload *w) {
    if (w->transformer) {
        setup_transformer(w);
        return;
    }
    int64_t n_labels = w->batch, classes = 10;
    if (w->lstm || w->gru) {
        int64_t G = w->gru ? 3 : 4; /* gates */
        w->p[0] = param(2, (int64_t[]){G * LSTM_H, LSTM_I}, LSTM_H); /* weight_ih_l0 */
        w->p[1] = param(2, (int64_t[]){G * LSTM_H, LSTM_H}, LSTM_H); /* weight_hh_l0 */
        w->p[2] = param(1, (int64_t[]){G * LSTM_H}, LSTM_H);
        w->p[3] = param(1, (int64_t[]){G * LSTM_H}, LSTM_H);
        w->p[4] = param(2, (int64_t[]){LSTM_V, LSTM_H}, LSTM_H);
        w->p[5] = param(1, (int64_t[]){LSTM_V}, LSTM_H);
        w->np = 6;
        w->x = em_empty(3, (int64_t[]){LSTM_T, w->batch, LSTM_I}, EM_F32, em_cpu());
        n_labels = LSTM_T * w->batch, classes = LSTM_V;
    } else if (w->cnn) {
        w->p[0] = param(4, (int64_t[]){32, 1, 3, 3}, 9);
        w->p[1] = param(1, (int64_t[]){32}, 9);
        w->p[2] = param(4, (int64_t[]){64, 32, 3, 3}, 288);
        w->p[3] = param(1, (int64_t[]){64}, 288);
        w->p[4] = param(2, (int64_t[]){128, 3136}, 3136);
        w->p[5] = param(1, (int64_t[]){128}, 3136);
        w->p[6] = param(2, (int64_t[]){10, 128}, 128);
        w->p[7] = param(1, (int64_t[]){10}, 128);
        w->np = 8;
        w->x = em_empty(4, (int64_t[]){w->batch, 1, 28, 28}, EM_F32, em_cpu());
    } else {
        w->p[0] = param(2, (int64_t[]){512, 784}, 784);
        w->p[1] = param(1, (int64_t[]){512}, 784);
        w->p[2] = param(2, (int64_t[]){256, 512}, 512);
        w->p[3] = param(1, (int64_t[]){256}, 512);
        w->p[4] = param(2, (int64_t[]){10, 256}, 256);
        w->p[5] = param(1, (int64_t[]){10}, 256);
        w->np = 6;
        w->x = em_empty(2, (int64_t[]){w->batch, 784}, EM_F32, em_cpu());
    }
    if (!w->x || em_uniform_(w->x, 0, 1, NULL) != EM_OK) die("input");
    em_tensor *u = em_empty(1, (int64_t[]){n_labels}, EM_F32, em_cpu());
    if (!u || em_uniform_(u, 0, (double)classes, NULL) != EM_OK) die("labels");
    w->y = em_to_dtype(u, EM_I64); /* truncation: uniform in 0..classes - 1 */
    em_tensor_release(u);
    if (!w->y) die("labels");
    em_dict *params = em_dict_new();
    for (int i = 0; i < w->np; i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        if (!params || em_dict_set(params, name, w->p[i]) != EM_OK) die("parameters");
    }
    w->opt = em_optimizer_new("Adam", params, NULL); /* torch.optim.Adam's defaults */
    if (!w->opt) die("optimizer");
    if (w->clip) w->opt_params = params;
    else em_dict_free(params);
}

/* --memory: the activation bytes held when backward starts (set by step when not NULL). */
static size_t *held_at_loss;

static size_t activation_bytes(bool peak) {
    em_memory_stats st;
    if (em_memory_stats_get(em_cpu(), &st) != EM_OK) die("memory stats");
    return peak ? st.peak[EM_MEM_ACTIVATION] : st.current[EM_MEM_ACTIVATION];
}

static void step(workload *w) {
    em_tensor *const *p = w->p;
    em_trace_options topt = {.struct_size = sizeof topt};
    if (w->traced && em_trace_begin(&topt) != EM_OK) die("trace_begin");
    em_profiler_options popt = {.struct_size = sizeof popt, .trace = w->profiled == 2};
    em_profiler *prof = w->profiled ? em_profiler_begin(&popt) : NULL;
    if (w->profiled && !prof) die("profiler_begin");
    if (em_scope_begin() != EM_OK) die("scope");
    em_tensor *h;
    if (w->transformer) {
        em_tensor *loss = em_mse_loss(em_module_forward(w->model, w->x), w->y,
                                      EM_REDUCTION_MEAN);
        if (!loss) die("forward");
        if (em_backward(loss) != EM_OK) die("backward");
        if (em_optimizer_step(w->opt) != EM_OK) die("optimizer step");
        em_optimizer_zero_grad(w->opt);
        if (em_scope_end() != EM_OK) die("scope");
        return;
    }
    if (w->amp && em_autocast_begin("cpu", EM_BF16) != EM_OK) die("autocast_begin");
    if (w->lstm || w->gru) {
        em_tensor *wt = em_cat(2, (const em_tensor *const[]){p[0], p[1]}, 1);
        em_tensor *y = w->gru ? em_gru(w->x, NULL, wt, p[2], p[3], NULL, false, NULL, NULL)
                              : em_lstm(w->x, NULL, NULL, wt, em_add(p[2], p[3]), NULL, false,
                                        NULL, NULL, NULL);
        if (!y) die(w->gru ? "gru" : "lstm");
        h = em_linear(em_reshape(y, 2, (int64_t[]){LSTM_T * w->batch, LSTM_H}), p[4], p[5]);
    } else if (w->cnn) {
        const int64_t pad[2] = {1, 1}, k2[2] = {2, 2};
        /* Channels-last activations (as a Conv2d layer with memory_format: channels_last
         * runs): the input's copy in that layout each step, then conv, ReLU and pooling keep
         * it up to the flatten, which makes the one row-major copy fc1 reads. Each conv and
         * its ReLU are one conv2d_relu (a Conv2d layer with activation: relu). */
        /* blocked: the nChw16c storage layout instead (a Conv2d with memory_format: blocked
         * prefers it for its output: conv1 reads the plain image and writes it). */
        em_layout was = w->blocked ? em_layout_prefer(EM_LAYOUT_NCHW16C) : EM_LAYOUT_PLAIN;
        /* blocked: each ReLU in the pooling after it instead (max_pool2d_relu, a MaxPool2d with
         * activation: relu after a plain Conv2d): the ReLU on the pooled quarter both ways. */
        em_tensor *(*conv)(const em_tensor *, const em_tensor *, const em_tensor *,
                           const int64_t *, const int64_t *, const int64_t *, int64_t) =
            w->blocked ? em_conv2d : em_conv2d_relu;
        em_status (*pool)(const em_tensor *, const int64_t *, const int64_t *, const int64_t *,
                          const int64_t *, bool, em_tensor **, em_tensor **) =
            w->blocked ? em_max_pool2d_relu : em_max_pool2d;
        em_tensor *a = conv(w->blocked ? w->x : em_channels_last(w->x), p[0], p[1], NULL, pad,
                            NULL, 1);
        if (w->blocked) em_layout_prefer(was);
        if (!a || pool(a, k2, NULL, NULL, NULL, false, &a, NULL) != EM_OK) die("pool1");
        a = conv(a, p[2], p[3], NULL, pad, NULL, 1);
        if (!a || pool(a, k2, NULL, NULL, NULL, false, &a, NULL) != EM_OK) die("pool2");
        h = em_linear(em_relu(em_linear(em_flatten(a, 1, 3), p[4], p[5])), p[6], p[7]);
    } else {
        h = em_relu(em_linear(em_relu(em_linear(w->x, p[0], p[1])), p[2], p[3]));
        h = em_linear(h, p[4], p[5]);
    }
    em_tensor *loss = em_cross_entropy(h, w->y, NULL, EM_REDUCTION_MEAN, -100, 0);
    if (!loss) die("forward");
    if (w->amp && em_autocast_end() != EM_OK) die("autocast_end");
    if (held_at_loss) *held_at_loss = activation_bytes(false);
    if (em_backward(loss) != EM_OK) die("backward");
    double norm = 0;
    if (w->clip && em_clip_grad_norm_(w->opt_params, 1.0, 2.0, false, &norm) != EM_OK)
        die("clip_grad_norm_");
    if (em_optimizer_step(w->opt) != EM_OK) die("optimizer step");
    em_optimizer_zero_grad(w->opt);
    if (em_scope_end() != EM_OK) die("scope");
    if (w->traced) {
        em_trace *tr = em_trace_end();
        if (!tr) die("trace_end");
        em_trace_free(tr);
    }
    if (prof) {
        if (em_profiler_end(prof) != EM_OK) die("profiler_end");
        if (w->profiled == 2) {
            FILE *f = fopen("/dev/null", "w");
            if (!f || em_profiler_write_trace(prof, f) != EM_OK) die("profiler_write_trace");
            fclose(f);
        }
        em_profiler_free(prof);
    }
}


/* --calls: every kernel call's wall and CPU time, per call site (op and operand layouts). */
enum { SITES = 64, SITE_CALLS = 4096, DEPTHS = 16, TASKS = 32 };
static struct call_site {
    char key[192];
    int n;
    double ms[SITE_CALLS], cpu[SITE_CALLS];
    double own[SITE_CALLS], others[SITE_CALLS]; /* the calling thread's CPU, the rest's */
    double used[SITE_CALLS];                    /* threads that ran during the call */
} sites[SITES];
static int n_sites;
static double call_t0[DEPTHS], call_c0[DEPTHS];
/* Every thread of the process but the caller (OpenMP's workers, OpenBLAS's pool, ...), listed
 * from /proc/self/task after the warm-up step, each read through its CPU clock (Linux encodes
 * a thread's CPU-time clock as (~tid << 3) | 6: CPUCLOCK_SCHED, per thread). */
static clockid_t task_clock[TASKS];
static int n_tasks;
static double task_c0[DEPTHS][TASKS], own_c0[DEPTHS];
enum { USED_US = 2 }; /* a thread ran in a call when its CPU time grew by 2 us or more */

static void list_tasks(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return; /* not Linux: only the calling thread's column is meaningful */
    struct dirent *de;
    long me = 0;
    {
        FILE *f = fopen("/proc/thread-self/stat", "r");
        if (f) {
            if (fscanf(f, "%ld", &me) != 1) me = 0;
            fclose(f);
        }
    }
    while ((de = readdir(d)) != NULL && n_tasks < TASKS) {
        long tid = atol(de->d_name);
        if (tid <= 0 || tid == me) continue;
        task_clock[n_tasks++] = (clockid_t)((~(unsigned long)tid << 3) | 6);
    }
    closedir(d);
}

static double clock_ms(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* A call that runs a kernel (not a composite, whose sub-ops are reported, nor a view). */
static bool is_kernel_call(const em_op_event *ev) {
    return ev->kind != EM_OP_EVENT_COMPOSITE && ev->kind != EM_OP_EVENT_VIEW &&
           ev->depth < DEPTHS;
}

static void call_begin(void *user, const em_op_event *ev) {
    (void)user;
    if (!is_kernel_call(ev)) return;
    /* Nested: the other threads' clocks outermost, the process's CPU clock (the column
     * step_profile.py --cpu-time sets beside step_floor's) next to the wall clock innermost, so
     * that its interval holds as few of the observer's own clock reads as step_floor's does
     * (each CPU-time clock read is a system call, ~0.5 us here; with the thread's clock read
     * inside it, every call's figure carried ~1 us of them). */
    for (int t = 0; t < n_tasks; t++) task_c0[ev->depth][t] = clock_ms(task_clock[t]);
    own_c0[ev->depth] = clock_ms(CLOCK_THREAD_CPUTIME_ID);
    call_c0[ev->depth] = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
    call_t0[ev->depth] = clock_ms(CLOCK_MONOTONIC);
}

static void call_end(void *user, const em_op_event *ev) {
    (void)user;
    if (!is_kernel_call(ev)) return;
    double ms = clock_ms(CLOCK_MONOTONIC) - call_t0[ev->depth];
    double cpu = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - call_c0[ev->depth];
    double own = clock_ms(CLOCK_THREAD_CPUTIME_ID) - own_c0[ev->depth], others = 0;
    int used = own * 1e3 >= USED_US;
    for (int t = 0; t < n_tasks; t++) {
        double d = clock_ms(task_clock[t]) - task_c0[ev->depth][t];
        if (d > 0) others += d; /* a thread that exited meanwhile reads as an error: skipped */
        used += d * 1e3 >= USED_US;
    }
    char key[192];
    int len = snprintf(key, sizeof key, "%s", ev->name);
    bool list = ev->kind == EM_OP_EVENT_LIST; /* fused optimizer steps: name and list length */
    if (list) len += snprintf(key + len, sizeof key - (size_t)len, " (%d tensors)", ev->n_in);
    for (int i = 0; !list && i < ev->n_in && len < (int)sizeof key; i++) {
        const em_tensor *t = ev->in[i];
        if (!t) continue;
        int nd = em_tensor_ndim(t);
        const int64_t *sh = em_tensor_shape(t), *st = em_tensor_strides(t);
        len += snprintf(key + len, sizeof key - (size_t)len, " ");
        for (int d = 0; d < nd && len < (int)sizeof key; d++)
            len += snprintf(key + len, sizeof key - (size_t)len, "%s%" PRId64, d ? "x" : "",
                            sh[d]);
        /* a storage layout instead of the (plain) strides: "(nChw16c)" */
        if (em_tensor_layout(t) == EM_LAYOUT_NCHW16C && len < (int)sizeof key)
            len += snprintf(key + len, sizeof key - (size_t)len, "(nChw16c");
        for (int d = 0; d < nd && len < (int)sizeof key && !em_tensor_layout(t); d++)
            len += snprintf(key + len, sizeof key - (size_t)len, "%s%" PRId64, d ? "," : "(",
                            st[d]);
        if (nd > 0 && len < (int)sizeof key)
            len += snprintf(key + len, sizeof key - (size_t)len, ")");
    }
    int s = 0;
    while (s < n_sites && strcmp(sites[s].key, key) != 0) s++;
    if (s == n_sites) {
        if (n_sites == SITES) return;
        snprintf(sites[n_sites++].key, sizeof sites[0].key, "%s", key);
    }
    struct call_site *g = &sites[s];
    if (g->n < SITE_CALLS) {
        g->cpu[g->n] = cpu, g->own[g->n] = own, g->others[g->n] = others, g->used[g->n] = used;
        g->ms[g->n++] = ms;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report_calls(const workload *w, int steps, double step_wall, double step_cpu) {
    double wall = 0, cpu = 0;
    printf("%s: %d steps, %.4f ms wall and %.4f ms CPU (all threads) per step; each kernel call "
           "site (inputs: shape(strides)), ms per call:\n", w->name, steps, step_wall, step_cpu);
    printf("  %-76s %5s %9s %9s %9s %7s %9s %9s\n", "call site", "/step", "wall med",
           "wall mean", "cpu med", "threads", "caller", "others");
    for (int s = 0; s < n_sites; s++) {
        struct call_site *g = &sites[s];
        double sum = 0, csum = 0;
        for (int i = 0; i < g->n; i++) sum += g->ms[i], csum += g->cpu[i];
        double *cols[] = {g->ms, g->cpu, g->own, g->others, g->used};
        for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
            qsort(cols[c], (size_t)g->n, sizeof g->ms[0], cmp_double);
        printf("  %-76s %5.2f %9.4f %9.4f %9.4f %7.0f %9.4f %9.4f\n", g->key,
               (double)g->n / steps, g->ms[g->n / 2], sum / g->n, g->cpu[g->n / 2],
               g->used[g->n / 2], g->own[g->n / 2], g->others[g->n / 2]);
        wall += sum, cpu += csum;
    }
    printf("  all kernel calls: %.4f ms wall, %.4f ms CPU per step (means)\n", wall / steps,
           cpu / steps);
    em_plugin_info info;
    for (size_t i = 0; em_plugin_get(i, &info) == EM_OK; i++)
        if (info.name && strcmp(info.name, "ember-cpu") == 0 && em_plugin_describe(i))
            printf("ember-cpu: %s\n", em_plugin_describe(i));
}

static workload W[] = {
    {.name = "train_mlp_b128", .iters = 10, .cnn = false, .batch = 128},
    {.name = "train_mlp_b128_clip", .iters = 10, .cnn = false, .clip = true, .batch = 128},
    {.name = "train_cnn_b64", .iters = 3, .cnn = true, .batch = 64},
    {.name = "train_cnn_b64_blocked", .iters = 3, .cnn = true, .blocked = true, .batch = 64},
    {.name = "train_cnn_b64_traced", .iters = 3, .cnn = true, .traced = true, .batch = 64},
    {.name = "train_transformer_b32", .iters = 2, .transformer = true, .batch = 32},
    {.name = "train_cnn_b64_bf16", .iters = 3, .cnn = true, .amp = true, .batch = 64},
    {.name = "train_lstm_h256", .iters = 3, .lstm = true, .batch = 32},
    {.name = "train_gru_h256", .iters = 3, .gru = true, .batch = 32},
    {.name = "train_cnn_b64_profiled", .iters = 3, .cnn = true, .profiled = 1, .batch = 64},
    {.name = "train_cnn_b64_chrometrace", .iters = 3, .cnn = true, .profiled = 2, .batch = 64},
};
#define N_WORKLOADS ((int)(sizeof W / sizeof W[0]))

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < N_WORKLOADS; i++) printf("%s\n", W[i].name);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--cpu-time") == 0) step_clock = CLOCK_PROCESS_CPUTIME_ID;
    if (em_init() != EM_OK) die("em_init");
    if (argc > 1 && strcmp(argv[1], "--memory") == 0) {
        printf("%-22s %18s %18s\n", "workload", "held at backward", "step peak");
        for (int a = 2; a < argc; a++) {
            workload *w = NULL;
            for (int i = 0; i < N_WORKLOADS; i++)
                if (strcmp(W[i].name, argv[a]) == 0) w = &W[i];
            if (!w) {
                fprintf(stderr, "train_step: no workload '%s' (--list)\n", argv[a]);
                return 2;
            }
            if (!w->ready) {
                setup(w);
                step(w);
                w->ready = true;
            }
            size_t base = activation_bytes(false), held = 0;
            em_memory_reset_peak();
            held_at_loss = &held;
            step(w);
            held_at_loss = NULL;
            printf("%-22s %18zu %18zu\n", w->name, held - base, activation_bytes(true) - base);
        }
        return 0;
    }
    if (argc > 2 && strcmp(argv[1], "--calls") == 0) {
        workload *w = NULL;
        for (int i = 0; i < N_WORKLOADS; i++)
            if (strcmp(W[i].name, argv[2]) == 0) w = &W[i];
        int n = argc > 3 ? atoi(argv[3]) : 50;
        if (!w || n < 1 || n > SITE_CALLS) {
            fprintf(stderr, "train_step: --calls NAME [steps 1..%d]: no workload '%s' (--list)\n",
                    SITE_CALLS, argv[2]);
            return 2;
        }
        setup(w);
        step(w); /* warm-up: primitive creation, the GEMM autotuner, the allocator's cache */
        list_tasks();
        em_observer obs = {.struct_size = sizeof obs, .begin = call_begin, .end = call_end};
        if (em_observer_push(&obs) != EM_OK) die("observer_push");
        double t0 = clock_ms(CLOCK_MONOTONIC), c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
        for (int i = 0; i < n; i++) step(w);
        double wall = (clock_ms(CLOCK_MONOTONIC) - t0) / n;
        double cpu = (clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0) / n;
        if (em_observer_pop(&obs) != EM_OK) die("observer_pop");
        report_calls(w, n, wall, cpu);
        em_optimizer_free(w->opt);
        em_module_free(w->model);
        em_dict_free(w->opt_params);
        for (int k = 0; k < w->np; k++) em_tensor_release(w->p[k]);
        em_tensor_release(w->x), em_tensor_release(w->y);
        em_shutdown();
        return 0;
    }
    if (argc > 2 && strcmp(argv[1], "--profile") == 0) {
        workload *w = NULL;
        for (int i = 0; i < N_WORKLOADS; i++)
            if (strcmp(W[i].name, argv[2]) == 0) w = &W[i];
        int n = argc > 3 ? atoi(argv[3]) : 50;
        if (!w || n < 1) {
            fprintf(stderr, "train_step: --profile NAME [steps >= 1]: no workload '%s' (--list)\n",
                    argv[2]);
            return 2;
        }
        setup(w);
        step(w); /* warm-up: primitive creation, the GEMM autotuner, the allocator's cache */
        em_profiler *prof = em_profiler_begin(NULL);
        if (!prof) die("profiler_begin");
        double t0 = now_ms();
        for (int i = 0; i < n; i++) step(w);
        double ms = (now_ms() - t0) / n;
        if (em_profiler_end(prof) != EM_OK) die("profiler_end");
        printf("%s: %d steps under the op profiler, %.3f ms per step (the profiler's cost "
               "included); totals over the %d steps:\n", w->name, n, ms, n);
        em_profiler_report(prof, stdout, 0);
        em_profiler_free(prof);
        em_optimizer_free(w->opt);
        em_module_free(w->model);
        em_dict_free(w->opt_params);
        for (int k = 0; k < w->np; k++) em_tensor_release(w->p[k]);
        em_tensor_release(w->x), em_tensor_release(w->y);
        em_shutdown();
        return 0;
    }
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = '\0';
        workload *w = NULL;
        for (int i = 0; i < N_WORKLOADS; i++)
            if (strcmp(W[i].name, line) == 0) w = &W[i];
        if (!w) {
            printf("%s unknown\n", line);
            fflush(stdout);
            continue;
        }
        if (!w->ready) {
            setup(w);
            step(w); /* warm-up */
            w->ready = true;
        }
        double t0 = now_ms(), each[64];
        for (int i = 0; i < w->iters; i++) {
            double t = now_ms();
            step(w);
            each[i] = now_ms() - t;
        }
        printf("%s %.6f", w->name, (now_ms() - t0) / w->iters);
        for (int i = 0; i < w->iters; i++) printf(" %.6f", each[i]);
        printf("\n");
        fflush(stdout);
    }
    for (int i = 0; i < N_WORKLOADS; i++) {
        if (!W[i].ready) continue;
        em_optimizer_free(W[i].opt);
        em_module_free(W[i].model);
        em_dict_free(W[i].opt_params);
        for (int k = 0; k < W[i].np; k++) em_tensor_release(W[i].p[k]);
        em_tensor_release(W[i].x), em_tensor_release(W[i].y);
    }
    em_shutdown();
    return 0;
}
