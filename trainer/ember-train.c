/*
 * ember-train.c — the reference trainer: `ember-train [CONFIG] [options]`.
 *
 * This half reads the command line and the config file (ember/config.h), and builds what the
 * run needs — device, model, datasets and loaders' transforms, loss, optimizer with parameter
 * groups, scheduler — checking everything it can before the first step, so that a typo, an
 * unknown layer, a missing data file, a model that does not fit the data or an output that
 * cannot be written (--checkpoint, --save-weights) is exit code 2 with a message naming the
 * place, never a crash mid-run. loop.c runs the training; this half also handles SIGINT and
 * SIGTERM during it (see "signals" below).
 *
 * Without CONFIG it trains examples/digits.yaml (the bundled digits set): from the source tree
 * when run uninstalled, else from the installed data directory.
 */
#include "ember/autograd.h"
#include "ember/comm.h"
#include "ember/config.h"
#include "ember/data.h"
#include "ember/ddp.h"
#include "ember/device.h"
#include "ember/dict.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/init.h"
#include "ember/module.h"
#include "ember/onnx.h"
#include "ember/optim.h"
#include "ember/options.h"
#include "ember/plugin.h"
#include "ember/random.h"
#include "ember/scope.h"
#include "ember/serialize.h"
#include "ember/tensor.h"
#include "ember/trace.h"
#include "trainer.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <fnmatch.h>
#include <getopt.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* Options that override the optimizer/scheduler sections. */
static const char *cli_optimizer, *cli_scheduler, *cli_data;
static double cli_lr = NAN, cli_momentum = NAN, cli_wd = NAN;
static int64_t cli_warmup = -1; /* -1: not given */

/* ---- signals ------------------------------------------------------------------------------
 * During training the first SIGINT or SIGTERM asks the loop to stop after the current step
 * and save (stop_flag). A second one from the same sender (siginfo's si_pid and si_code)
 * within 250 ms of the first is the same signal — timeout(1) signals the process and then its
 * process group, a kill may reach it twice — and is only counted. Any other second signal, and
 * any signal once the loop is done, stops at once, after printing what was and was not saved.
 *
 * The handler decides (it knows the first signal, under a spin lock that only handlers take)
 * and marks a stop at once in `dying` before the interrupted thread resumes; a thread then
 * formats the message and ends the process, so that part may take a lock and call snprintf.
 * stop_save_begin refuses to start a save once `dying` is set, and the thread reads what was
 * saved under the same lock, so the message never calls saved what was cut short, nor cut
 * short what it never started. Before training (and in --dry-run, --eval-only, --predict)
 * the signals keep their default action: stop at once. */

enum { SAME_SIGNAL_NS = 250000000 };

typedef enum sig_verdict { SIG_STOP_AFTER_STEP, SIG_REPEAT, SIG_STOP_NOW } sig_verdict;

typedef struct sig_rec {
    int sig, code;
    pid_t pid;
    int64_t ns;        /* CLOCK_MONOTONIC when it was delivered */
    sig_verdict verdict;
    int64_t first_ns;  /* the first signal's ns; 0: this is the first */
} sig_rec;

static atomic_int stop_flag;
static struct {
    /* the handlers' */
    atomic_flag lock;
    bool have_first;
    sig_rec first;
    atomic_bool training, dying;
    atomic_int repeats;
    int pipe[2];
    /* the thread's, and the loop's under mu */
    pthread_mutex_t mu;
    pthread_t thread;
    bool started, in_save, any_saved;
    const char *checkpoint_option;       /* --checkpoint, or NULL */
    char saving_what[32], saving[4096];  /* the save in progress */
    char saved[4096];                    /* the last checkpoint written */
    int64_t saved_step;
} sigs = {.lock = ATOMIC_FLAG_INIT, .pipe = {-1, -1}, .mu = PTHREAD_MUTEX_INITIALIZER};

static void on_signal(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    int saved_errno = errno;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    sig_rec rec = {sig, si ? si->si_code : 0, si ? si->si_pid : 0,
                   (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec, SIG_STOP_NOW, 0};
    while (atomic_flag_test_and_set(&sigs.lock)) {
    } /* another thread's handler, a few instructions long (sa_mask: never this thread's) */
    if (!sigs.have_first) {
        sigs.have_first = true;
        sigs.first = rec;
        rec.verdict = atomic_load(&sigs.training) ? SIG_STOP_AFTER_STEP : SIG_STOP_NOW;
    } else {
        rec.first_ns = sigs.first.ns;
        if (rec.pid == sigs.first.pid && rec.code == sigs.first.code &&
            rec.ns - sigs.first.ns < SAME_SIGNAL_NS)
            rec.verdict = SIG_REPEAT;
    }
    atomic_flag_clear(&sigs.lock);
    if (rec.verdict == SIG_STOP_AFTER_STEP) {
        atomic_store(&stop_flag, sig);
    } else if (rec.verdict == SIG_REPEAT) {
        atomic_fetch_add(&sigs.repeats, 1);
    } else {
        atomic_store(&sigs.dying, true);
        ssize_t w = write(sigs.pipe[1], &rec, sizeof rec); /* atomic: smaller than PIPE_BUF */
        (void)w;
    }
    errno = saved_errno;
}

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

/* Print what was and was not saved, then die of the signal (as its default action would). */
static void stop_at_once(const sig_rec *rec) {
    pthread_mutex_lock(&sigs.mu); /* kept: no save starts after this */
    char msg[12288], from[64] = "";
    size_t pos = 0;
#define MSG(...) \
    (pos += (size_t)snprintf(msg + pos, pos < sizeof msg ? sizeof msg - pos : 0, __VA_ARGS__), \
     pos = pos < sizeof msg ? pos : sizeof msg - 1)
    const char *name = rec->sig == SIGTERM ? "SIGTERM" : "SIGINT";
    bool training = atomic_load(&sigs.training);
    if (rec->code == SI_USER && rec->pid > 0) snprintf(from, sizeof from, " from pid %ld", (long)rec->pid);
    else if (rec->code == SI_KERNEL) snprintf(from, sizeof from, " from the terminal");
    if (rec->first_ns)
        MSG("ember-train: a second %s%s, %.0f ms after the first: stopping at once.\n", name,
            from, (double)(rec->ns - rec->first_ns) * 1e-6);
    else
        MSG("ember-train: %s%s after the training: stopping at once.\n", name, from);
    if (sigs.in_save)
        MSG("  not saved: the %s being written to %s is abandoned; the file holds what it held "
            "before (or the new one, if the save had just finished: saves are atomic), and the "
            "next start removes its temporary file\n", sigs.saving_what, sigs.saving);
    if (sigs.any_saved)
        MSG("  saved: the checkpoint %s (step %" PRId64 ")%s\n", sigs.saved, sigs.saved_step,
            training ? "; the steps after it are not saved" : "");
    else if (!sigs.checkpoint_option)
        MSG("  not saved: anything (no --checkpoint was given)\n");
    else
        MSG("  not saved: anything (no checkpoint of this run had been written yet)\n");
#undef MSG
    write_all(2, msg, pos);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(rec->sig, &sa, NULL);
    raise(rec->sig);
    _exit(128 + rec->sig);
}

static void *signal_thread(void *arg) {
    (void)arg;
    for (;;) {
        sig_rec rec;
        ssize_t n = read(sigs.pipe[0], &rec, sizeof rec);
        if (n < 0 && errno == EINTR) continue;
        if (n != (ssize_t)sizeof rec) return NULL; /* the write end is closed: the run is over */
        stop_at_once(&rec);
    }
}

/* Install the handlers and start the thread, for the training loop. */
static bool signals_start(const run *r) {
    if (pipe(sigs.pipe) != 0 || fcntl(sigs.pipe[0], F_SETFD, FD_CLOEXEC) != 0 ||
        fcntl(sigs.pipe[1], F_SETFD, FD_CLOEXEC) != 0 ||
        fcntl(sigs.pipe[1], F_SETFL, O_NONBLOCK) != 0) {
        fprintf(stderr, "ember-train: cannot set up the signal handling: %s\n", strerror(errno));
        return false;
    }
    sigs.checkpoint_option = r->s.checkpoint;
    atomic_store(&sigs.training, true);
    if (pthread_create(&sigs.thread, NULL, signal_thread, NULL) != 0) {
        fprintf(stderr, "ember-train: cannot start the signal thread\n");
        return false;
    }
    sigs.started = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT); /* one handler at a time per thread: the spin lock's rule */
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    return true;
}

/* Back to the default actions; the thread ends. */
static void signals_stop(void) {
    if (!sigs.started) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (atomic_load(&sigs.dying)) /* the thread is ending the process */
        for (;;) pause();
    close(sigs.pipe[1]);
    pthread_join(sigs.thread, NULL);
    close(sigs.pipe[0]);
    sigs.started = false;
}

void stop_save_begin(const char *what, const char *path) {
    pthread_mutex_lock(&sigs.mu);
    if (atomic_load(&sigs.dying)) { /* a second signal: the thread is ending the process */
        pthread_mutex_unlock(&sigs.mu);
        for (;;) pause();
    }
    sigs.in_save = true;
    snprintf(sigs.saving_what, sizeof sigs.saving_what, "%s", what);
    snprintf(sigs.saving, sizeof sigs.saving, "%s", path);
    pthread_mutex_unlock(&sigs.mu);
}

void stop_save_end(bool checkpoint, int64_t step) {
    pthread_mutex_lock(&sigs.mu);
    sigs.in_save = false;
    if (checkpoint) {
        sigs.any_saved = true;
        memcpy(sigs.saved, sigs.saving, sizeof sigs.saved);
        sigs.saved_step = step;
    }
    pthread_mutex_unlock(&sigs.mu);
}

void stop_training_over(void) { atomic_store(&sigs.training, false); }

int stop_repeats(void) { return atomic_load(&sigs.repeats); }

/* "ember-train: WHAT: MESSAGE", without WHAT when the message already starts with it (a failed
 * backward says "backward: ..." itself; "backward: backward: ..." says nothing more). */
void report_error(const char *what) {
    const char *msg = em_last_error();
    size_t n = what ? strlen(what) : 0;
    if (what && strncasecmp(msg, what, n) == 0 && msg[n] == ':') what = NULL;
    fprintf(stderr, "ember-train: %s%s%s\n", what ? what : "", what ? ": " : "", msg);
}

void say(const run *r, const char *fmt, ...) {
    if (r->s.quiet) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

void warn(const run *r, const char *fmt, ...) {
    if (r->s.quiet || !primary(r)) return; /* data-parallel: rank 0 speaks for the run */
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

static void usage(FILE *f) {
    fprintf(f,
"usage: ember-train [CONFIG] [options]\n"
"Train the model a YAML config describes (default: examples/digits.yaml, the bundled digits).\n"
"Options override the config file; a number is checked against the same range whether it\n"
"comes from an option or the config (the message names the key or option and the range).\n"
"\n"
"  --data PATH              dataset location (the data class's 'path' option)\n"
"  --device DEV             cpu, cuda, cuda:N (default: a GPU when a backend finds one, else\n"
"                           cpu); a device asked for and absent is an error, never a fall back\n"
"  --epochs N               epochs to train\n"
"  --max-steps N            stop after N optimizer steps (0: no limit)\n"
"  --batch-size N           samples per batch (per micro-batch with --accum-steps)\n"
"  --lr X                   learning rate (every parameter group)\n"
"  --optimizer NAME         optimizer class (SGD, Adam, AdamW, ...)\n"
"  --momentum X             the optimizer's momentum option\n"
"  --weight-decay X         the optimizer's weight_decay (groups that set their own keep it)\n"
"  --scheduler NAME         lr scheduler class (its options come from the config)\n"
"  --warmup-epochs N        linear lr warm-up over the first N epochs (from lr/(N+1) up to\n"
"                           lr), then the scheduler, whose epoch 0 is epoch N+1 (as PyTorch's\n"
"                           SequentialLR(LinearLR, scheduler, milestones=[N])); per step with\n"
"                           a per-step scheduler; without one the lr stays constant after it\n"
"  --accum-steps N          accumulate gradients over N micro-batches per step; the last\n"
"                           group of an epoch steps with what it has\n"
"  --clip-grad-norm X       clip the gradients' total 2-norm to X (0: no clipping; with\n"
"                           --amp fp16 the unscaled gradients)\n"
"  --amp bf16|fp16|off      mixed precision (loop.amp): forward and loss in an autocast region\n"
"                           (matmuls and convolutions in the half dtype, softmax, norms and\n"
"                           losses in float32; parameters, gradients and the update stay\n"
"                           float32), also for validation, --eval-only and --predict. On the\n"
"                           CPU use bf16 (AVX512_BF16: about twice the f32 matmul rate); fp16\n"
"                           adds a gradient scaler (checkpointed; skipped steps and the final\n"
"                           scale are in the summary and metrics; loop.amp_init_scale and\n"
"                           loop.amp_growth_interval set its initial scale, default 65536, and\n"
"                           its growth interval, default 2000) and on the CPU works, through\n"
"                           f32 compute where there is no f16 kernel, but is slow there; off:\n"
"                           float32 (the default), also over a config's loop.amp\n"
"  --seed N                 seed of initialisation, shuffling, splits and dropout\n"
"  --deterministic          deterministic kernels only\n"
"  --graph-capture          (loop.graph_capture) on a device that captures graphs (CUDA), record\n"
"                           a full-size batch's training step (forward, loss, backward,\n"
"                           gradient norm and clipping, optimizer step) once as a graph and\n"
"                           replay it for the batches of that size; the epoch's last short\n"
"                           batch and evaluation run as usual. SGD, Adam and AdamW run\n"
"                           capturable: the lr (per-step and per-epoch schedules) and Adam's\n"
"                           step count are device tensors the replays read, as are the\n"
"                           gradient norm and the clip coefficient (amsgrad: op by op), and\n"
"                           --amp fp16's loss scale, its update and the skipping of a step;\n"
"                           dropout's masks come from the generator's state, which each\n"
"                           replay writes on the device, so they are the eager run's.\n"
"                           Refused, with the reason, on the CPU and for steps a replay would\n"
"                           get wrong: another optimizer, a per-step OneCycleLR cycling the\n"
"                           momentum, --accum-steps > 1, data parallelism, or an op that\n"
"                           cannot be captured (docs/cuda.md)\n"
"  --workers N              data loader threads\n"
"  --no-shuffle             keep the training set in order\n"
"  --init-weights FILE      start from a safetensors state dict (strict: every key and shape)\n"
"  --init-onnx FILE         the model is this ONNX file, imported (docs/onnx.md): its\n"
"                           initializers are the trainable parameters (the config's 'model'\n"
"                           is not used; 'model: {onnx: PATH}' in a config does the same);\n"
"                           the input-transform nodes an Ember export starts with are left\n"
"                           out, the config's data.transforms apply instead\n"
"  --init-weights-nonstrict load what matches from --init-weights and list what was skipped\n"
"  --save-weights FILE      write the final model state dict (safetensors)\n"
"  --export-onnx FILE       write the model as ONNX (docs/onnx.md; README \"Deploying a\n"
"                           model\"), the evaluation input transforms (to_float, normalize) as\n"
"                           the graph's first nodes, so it reads what the dataset holds: after\n"
"                           training; with --init-weights or --init-onnx and neither --epochs\n"
"                           nor --max-steps on the command line, the loaded model at once,\n"
"                           without training; with variable-length (padded) data, a model\n"
"                           with an LSTM, GRU or attention layer is refused (the graph has\n"
"                           no mask input)\n"
"  --save-best FILE         write the model state dict of each new best validation epoch\n"
"                           (the summary names the epoch); needs a validation set\n"
"  --checkpoint PATH        save a checkpoint each epoch, at --max-steps and on Ctrl-C; a\n"
"                           '{step}' in the file name numbers the files (see --keep); its\n"
"                           directory must exist (checked before the first step); a symbolic\n"
"                           link is written through to the file it names\n"
"                           (SIGINT/SIGTERM finish the current step, save, print the command\n"
"                           that resumes, exit 130; a second one from the same sender within\n"
"                           250 ms counts as the first, as timeout(1) sends two; any other\n"
"                           second signal stops at once, saying what was and was not saved)\n"
"  --keep N                 this run's checkpoints to keep when PATH has '{step}' (default 3);\n"
"                           other runs' files are left alone (a warning names them)\n"
"  --resume PATH            continue from a checkpoint; a '{step}' pattern: the newest of the\n"
"                           run its files belong to (several runs: refused, name the file),\n"
"                           or, that one damaged, the next newest, with a warning\n"
"  --metrics FILE           per-epoch metrics, CSV or JSON lines (by the .jsonl extension):\n"
"                           epoch, step, lr, train_loss, grad_norm (mean, before clipping),\n"
"                           val_loss, val_accuracy (val_mae), samples_per_s, data_wait_pct,\n"
"                           peak_memory, then train_accuracy (train_mae: over the epoch's\n"
"                           batches as trained), test_loss, test_accuracy (test_mae; the test\n"
"                           set is evaluated each epoch when there is one); a language\n"
"                           model (data class 'text') adds train_ppl, val_ppl and\n"
"                           val_unigram_ppl (perplexities: exp of the mean token loss); a\n"
"                           resumed run appends, and an epoch resumed mid-way reports all its\n"
"                           batches\n"
"  --metrics-steps FILE     a row every --log-every: step, epoch, loss (mean since the last\n"
"                           row), lr (lr_group0, lr_group1, ... with several groups),\n"
"                           grad_norm (the row's last step, before clipping), samples_per_s\n"
"                           and data_wait_s (since the last row); CSV or .jsonl\n"
"  --log-every N|Ts         every N steps, or every T seconds (e.g. 30s): a progress line when\n"
"                           stderr is not a terminal (on one: a bar redrawn after each step)\n"
"                           and a --metrics-steps row (default: 10s)\n"
"  --quiet                  no progress, no epoch lines, no warnings: only errors and the\n"
"                           summary (the library's own warnings too)\n"
"  --tensorboard DIR        TensorBoard event files (tensorboard --logdir DIR): a new\n"
"                           events.out.tfevents.* file in DIR (made when missing) with the\n"
"                           --metrics-steps figures as scalars at their step (train/loss,\n"
"                           train/lr/group0, ...) and the --metrics ones at each epoch's last\n"
"                           step (epoch/train_loss, ..., val/loss, val/accuracy, test/...);\n"
"                           written out at least every 10 s\n"
"  --tensorboard-histograms with --tensorboard: once per epoch, histograms of each trainable\n"
"                           parameter and its gradient (weights/NAME, gradients/NAME); or\n"
"                           tensorboard_histograms: true in the config's loop section\n"
"  --plot FILE              training curves as a picture, .png or .svg (PLplot): train and\n"
"                           validation loss, accuracy (MAE), and the lr, against the step\n"
"                           (with the per-step loss of every --log-every) or the epoch;\n"
"                           redrawn at the end of each epoch (ember-plot draws the same from\n"
"                           --metrics / --metrics-steps files)\n"
"  --early-stop PATIENCE    stop when the validation metric (accuracy, or MAE for regression)\n"
"                           has not improved for PATIENCE epochs\n"
"  --eval-only              evaluate (--init-weights, --init-onnx or --resume) on the\n"
"                           validation/test sets\n"
"  --predict OUT.csv        write predictions for the test set (else validation) and exit:\n"
"                           index,predicted,target\n"
"  --predict-scores KIND    with --predict (classification): also each class's score, as\n"
"                           logits (logit_0, ...: the model's outputs) or probabilities\n"
"                           (prob_0, ...: their softmax)\n"
"  --generate N             a language model's text (data class 'text'): N tokens after\n"
"                           --prompt, printed to stdout; needs --init-weights, whose metadata\n"
"                           holds the vocabulary; the model sees the last seq_len tokens\n"
"  --prompt TEXT            the text generation starts from (at least one character)\n"
"  --temperature T          divide the logits by T > 0 before sampling (default 1)\n"
"  --top-k K                sample among the K most likely tokens only (default: all)\n"
"                           (the same --seed, prompt and settings give the same text)\n"
"  --eval-batch-size N      samples per batch in validation, test and --predict (loop key\n"
"                           eval_batch_size; default: --batch-size)\n"
"  --limit-batches N        at most N batches per epoch and per evaluation (0: no limit)\n"
"  --overfit-batches N      train and validate on the first N batches only (0: off)\n"
"  --summary                print the model summary and exit\n"
"  --memory-summary         memory by category after the first step and at the end\n"
"  --profile                ops by time, where they ran, bytes copied, CPU fallbacks, then the\n"
"                           10 ops with the most total time (at the end); all threads counted\n"
"                           together (training thread, loader workers), each one listed\n"
"  --trace FILE             with --profile's report, a timeline with a track per thread in\n"
"                           the Chrome trace-event format (open it in ui.perfetto.dev or\n"
"                           chrome://tracing): every op's start and duration on its device,\n"
"                           the loader's waits, the batches each worker filled and the\n"
"                           optimizer steps; written at the end\n"
"  --anomaly                anomaly mode: the op that first makes a NaN/Inf is named\n"
"  --dry-run                check the config, build everything, one forward+backward, exit\n"
"\n"
"Data-parallel training: `mpirun -np N ember-train CONFIG [options]` trains on N processes\n"
"(an MPI launcher: mpirun; Slurm's srun is untested; docs/distributed.md), each on its shard of\n"
"epoch with the config's --batch-size, so a step sees N x batch-size samples: the model of one\n"
"process with an N-times larger batch. Rank 0 prints and writes every file (metrics, weights,\n"
"checkpoints holding each rank's random state); validation and test cover each sample once.\n"
"A checkpoint resumes only with the same N. Without a launcher MPI is never started.\n"
"  --ddp-bucket-mib X       gradient bucket size in MiB, every bucket (default 25, the first 1)\n"
"  --sync-batchnorm         BatchNorm layers normalise with the statistics of every rank's\n"
"                           batch together (SyncBatchNorm), as one process on the N-times\n"
"                           larger batch does; without it each rank normalises its own\n"
"  (both only matter under a launcher; --predict and --overfit-batches are single-process)\n"
"\n"
"  --plugin PATH            load this plugin file (.so) too (repeatable); a config's top-level\n"
"                           'plugins: [PATH, ...]' does the same, paths relative to the config\n"
"  --list-plugins           plugins and the classes they registered\n"
"  --help, --version\n"
"\n"
"Exit codes: 0 ok; 1 training failure (NaN/Inf loss, runtime error) or a file that could not\n"
"be written (checkpoint, weights, metrics, predictions: the message names it and why); 2 usage,\n"
"config, data or model error, or an output place found unwritable before the first step; 130\n"
"interrupted by SIGINT/SIGTERM (after saving --checkpoint); 128+N: stopped at once by a second\n"
"signal N.\n");
}

/* ---- numbers from the command line and the config ----------------------------------------- */

static bool parse_i64(const char *t, int64_t lo, int64_t hi, int64_t *out) {
    if (!t || !*t) return false;
    char *end;
    errno = 0;
    long long v = strtoll(t, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_f64(const char *t, double *out) {
    if (!t || !*t) return false;
    char *end;
    errno = 0;
    double v = strtod(t, &end);
    if (errno || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

static bool parse_bool(const char *t, bool *out) {
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcmp(t, yes[i])) return *out = true, true;
        if (!strcmp(t, no[i])) return *out = false, true;
    }
    return false;
}

/* --log-every N (steps, >= 1) or Ts (seconds, > 0); false after the message. */
static bool parse_log_every(settings *s, const char *t) {
    size_t n = strlen(t);
    char num[64];
    int64_t steps;
    double secs;
    if (n > 1 && n < sizeof num && t[n - 1] == 's') {
        snprintf(num, sizeof num, "%.*s", (int)(n - 1), t);
        if (parse_f64(num, &secs) && secs > 0 && secs <= 1e9) {
            s->log_every = 0;
            s->log_every_s = secs;
            return true;
        }
    } else if (parse_i64(t, 1, INT64_MAX, &steps)) {
        s->log_every = steps;
        return true;
    }
    fprintf(stderr, "ember-train: --log-every: '%s' is not a number of steps (an integer >= 1) "
            "or of seconds (such as 30s) (see --help)\n", t);
    return false;
}

static int cfg_error(const em_config_node *n, const char *fmt, const char *a) {
    fprintf(stderr, "ember-train: %s: %s: ", em_config_node_where(n), em_config_node_path(n));
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    return EXIT_USAGE;
}

/* Every number ember-train reads, with the config key and the command-line option that set
 * it, and the one range both are checked against: a value from a file gets exactly the
 * checks of one typed on the command line, and the message names the key (or option) and
 * the range. (The optimizer's and scheduler's own options, lr in a config among them, are
 * checked by their class's option specs and the core, which refuses an lr that is not a
 * finite number >= 0, as --lr does.) */
typedef enum num_id {
    N_EPOCHS, N_MAX_STEPS, N_BATCH, N_ACCUM, N_WORKERS, N_LIMIT, N_OVERFIT, N_EARLY, N_SEED,
    N_KEEP, N_WARMUP, N_CROP, N_CLIP, N_LR, N_MOMENTUM, N_WD, N_SCALE, N_EVAL_BATCH, N_GENERATE,
    N_TOP_K, N_BUCKET, N_AMP_SCALE, N_AMP_GROWTH, N_COUNT
} num_id;

typedef struct num_range {
    const char *key;  /* where a config sets it, as a path ("loop.epochs"); NULL: nowhere */
    const char *flag; /* the command-line option; NULL: none */
    bool real;        /* a finite number in [lo, hi]; else an integer in [ilo, ihi] */
    double lo, hi;
    int64_t ilo, ihi;
} num_range;

#define INT_RANGE(k, f, a, b) {k, f, false, 0, 0, a, b}
#define REAL_RANGE(k, f, a, b) {k, f, true, a, b, 0, 0}
/* Counts are int32 where the loop multiplies them (epochs x batches, batches x batch size):
 * the products stay far from overflowing int64. */
static const num_range ranges[N_COUNT] = {
    [N_EPOCHS] = INT_RANGE("loop.epochs", "--epochs", 0, INT32_MAX),
    [N_MAX_STEPS] = INT_RANGE("loop.max_steps", "--max-steps", 0, EM_STEP_MAX), /* 0: none */
    [N_BATCH] = INT_RANGE("loop.batch_size", "--batch-size", 1, INT32_MAX),
    [N_ACCUM] = INT_RANGE("loop.accum_steps", "--accum-steps", 1, INT32_MAX),
    [N_WORKERS] = INT_RANGE("loop.workers", "--workers", 0, 256), /* the loader's limit */
    [N_LIMIT] = INT_RANGE("loop.limit_batches", "--limit-batches", 0, INT64_MAX), /* 0: none */
    [N_OVERFIT] = INT_RANGE("loop.overfit_batches", "--overfit-batches", 0, INT32_MAX),
    [N_EARLY] = INT_RANGE("loop.early_stop", "--early-stop", 0, INT32_MAX),
    [N_SEED] = INT_RANGE("loop.seed", "--seed", 0, INT64_MAX),
    [N_KEEP] = INT_RANGE(NULL, "--keep", 1, 1000000),
    [N_WARMUP] = INT_RANGE("scheduler.warmup_epochs", "--warmup-epochs", 0, INT32_MAX),
    [N_CROP] = INT_RANGE("data.transforms.crop_padding", NULL, 0, INT32_MAX), /* an int */
    [N_CLIP] = REAL_RANGE("loop.clip_grad_norm", "--clip-grad-norm", 0, DBL_MAX), /* 0: off */
    [N_LR] = REAL_RANGE(NULL, "--lr", 0, DBL_MAX),
    [N_MOMENTUM] = REAL_RANGE(NULL, "--momentum", -DBL_MAX, DBL_MAX),
    [N_WD] = REAL_RANGE(NULL, "--weight-decay", -DBL_MAX, DBL_MAX),
    [N_SCALE] = REAL_RANGE("data.transforms.scale", NULL, -DBL_MAX, DBL_MAX),
    [N_EVAL_BATCH] = INT_RANGE("loop.eval_batch_size", "--eval-batch-size", 1, INT32_MAX),
    [N_GENERATE] = INT_RANGE(NULL, "--generate", 1, 100000000),
    [N_TOP_K] = INT_RANGE(NULL, "--top-k", 1, INT32_MAX),
    [N_BUCKET] = REAL_RANGE(NULL, "--ddp-bucket-mib", 1.0 / 1024, 1048576), /* 1 KiB .. 1 TiB */
    /* --amp fp16's gradient scaler: its init_scale (at least its floor, 1) and
     * growth_interval (ember/grad_scaler.h) */
    [N_AMP_SCALE] = REAL_RANGE("loop.amp_init_scale", NULL, 1, FLT_MAX),
    [N_AMP_GROWTH] = INT_RANGE("loop.amp_growth_interval", NULL, 1, INT64_MAX),
};

/* "an integer in [0, 2147483647]", "a finite number >= 0" */
static const char *range_text(const num_range *nr, char *buf, size_t cap) {
    if (!nr->real)
        snprintf(buf, cap, "an integer in [%lld, %lld]", (long long)nr->ilo, (long long)nr->ihi);
    else if (nr->lo == -DBL_MAX)
        snprintf(buf, cap, "a finite number");
    else
        snprintf(buf, cap, "a finite number >= %g", nr->lo);
    return buf;
}

/* Text t as number id into *iv or *fv (by the range's kind); false when it is not one. */
static bool num_parse(num_id id, const char *t, int64_t *iv, double *fv) {
    const num_range *nr = &ranges[id];
    if (nr->real) return parse_f64(t, fv) && *fv >= nr->lo && *fv <= nr->hi;
    return parse_i64(t, nr->ilo, nr->ihi, iv);
}

/* A command-line value: false after a message naming the option and the range. */
static bool cli_num(num_id id, const char *t, int64_t *iv, double *fv) {
    if (num_parse(id, t, iv, fv)) return true;
    char r[96];
    fprintf(stderr, "ember-train: %s: '%s' is not %s (see --help)\n", ranges[id].flag, t,
            range_text(&ranges[id], r, sizeof r));
    return false;
}

/* A config value: 0, or EXIT_USAGE after a message naming the file, line, key and range (and
 * the command-line option that sets the same). */
static int cfg_num(num_id id, const em_config_node *n, int64_t *iv, double *fv) {
    const char *t = em_config_node_text(n);
    if (t && num_parse(id, t, iv, fv)) return 0;
    char r[96], as[64] = "";
    if (ranges[id].flag) snprintf(as, sizeof as, " (as for %s)", ranges[id].flag);
    fprintf(stderr, "ember-train: %s: %s: %s%s%s is not %s%s\n", em_config_node_where(n),
            ranges[id].key, t ? "'" : "", t ? t : "a list or map", t ? "'" : "",
            range_text(&ranges[id], r, sizeof r), as);
    return EXIT_USAGE;
}

/* "<where>: <what>: <error>", without a second location when the error already has one. */
static void located_error(const em_config_node *n, const char *what) {
    const char *e = em_last_error();
    const char *file = n ? em_config_node_where(n) : NULL;
    size_t flen = 0;
    if (file) {
        const char *c = strchr(file, ':');
        flen = c ? (size_t)(c - file) : strlen(file);
    }
    if (!n || (flen && !strncmp(e, file, flen)))
        fprintf(stderr, "ember-train: %s: %s\n", what, e);
    else
        fprintf(stderr, "ember-train: %s: %s: %s\n", em_config_node_where(n), what, e);
}

/* ---- device ------------------------------------------------------------------------------- */

static int pick_device(run *r) {
    if (!r->s.device[0]) {
        snprintf(r->s.device, sizeof r->s.device, "%s", em_device_count("cuda") > 0 ? "cuda" : "cpu");
    }
    if (em_device_parse(r->s.device, &r->dev) != EM_OK) {
        report_error("--device");
        return EXIT_USAGE;
    }
    char type[32];
    snprintf(type, sizeof type, "%s", r->s.device);
    char *colon = strchr(type, ':');
    if (colon) *colon = '\0';
    int count = em_device_count(type);
    char buf[64];
    em_device_str(r->dev, buf, sizeof buf);
    if (count <= 0) {
        fprintf(stderr, "ember-train: device '%s' asked for, but no %s device is present; "
                "loaded plugins: see --list-plugins\n", r->s.device, type);
        return EXIT_USAGE;
    }
    if ((int)r->dev.index >= count) {
        fprintf(stderr, "ember-train: device '%s' asked for, but only %d %s device%s present\n",
                buf, count, type, count == 1 ? " is" : "s are");
        return EXIT_USAGE;
    }
    return 0;
}

/* ---- the loop section ------------------------------------------------------------------- */

static int read_loop(run *r, const em_config_node *loop) {
    static const char *const keys[] = {"epochs", "max_steps", "batch_size", "accum_steps",
        "clip_grad_norm", "seed", "deterministic", "workers", "shuffle", "device",
        "limit_batches", "overfit_batches", "early_stop", "eval_batch_size",
        "tensorboard_histograms", "amp", "graph_capture", "amp_init_scale",
        "amp_growth_interval", NULL};
    if (!loop) return 0;
    if (em_config_check_keys(loop, keys) != EM_OK) {
        report_error(NULL);
        return EXIT_USAGE;
    }
    for (size_t i = 0; i < em_config_node_len(loop); i++) {
        const char *k;
        const em_config_node *v = em_config_node_at(loop, i, &k);
        const char *t = em_config_node_text(v);
        int rc = 0;
        int64_t iv;
        if (!t) return cfg_error(v, "expected a value%s", "");
        double fv;
        if (!strcmp(k, "epochs")) rc = cfg_num(N_EPOCHS, v, &r->s.epochs, &fv);
        else if (!strcmp(k, "max_steps")) rc = cfg_num(N_MAX_STEPS, v, &r->s.max_steps, &fv);
        else if (!strcmp(k, "batch_size")) rc = cfg_num(N_BATCH, v, &r->s.batch_size, &fv);
        else if (!strcmp(k, "accum_steps")) rc = cfg_num(N_ACCUM, v, &r->s.accum_steps, &fv);
        else if (!strcmp(k, "workers")) rc = cfg_num(N_WORKERS, v, &r->s.workers, &fv);
        else if (!strcmp(k, "limit_batches")) rc = cfg_num(N_LIMIT, v, &r->s.limit_batches, &fv);
        else if (!strcmp(k, "overfit_batches")) rc = cfg_num(N_OVERFIT, v, &r->s.overfit_batches, &fv);
        else if (!strcmp(k, "early_stop")) rc = cfg_num(N_EARLY, v, &r->s.early_stop, &fv);
        else if (!strcmp(k, "eval_batch_size")) rc = cfg_num(N_EVAL_BATCH, v, &r->s.eval_batch_size, &fv);
        else if (!strcmp(k, "amp_init_scale")) rc = cfg_num(N_AMP_SCALE, v, &iv, &r->s.amp_init_scale);
        else if (!strcmp(k, "amp_growth_interval"))
            rc = cfg_num(N_AMP_GROWTH, v, &r->s.amp_growth_interval, &fv);
        else if (!strcmp(k, "seed")) {
            if (!(rc = cfg_num(N_SEED, v, &iv, &fv))) r->s.seed = (uint64_t)iv;
        } else if (!strcmp(k, "clip_grad_norm")) {
            rc = cfg_num(N_CLIP, v, &iv, &r->s.clip_grad_norm);
        } else if (!strcmp(k, "deterministic")) {
            if (!parse_bool(t, &r->s.deterministic)) rc = cfg_error(v, "expected true or false, found '%s'", t);
        } else if (!strcmp(k, "graph_capture")) {
            if (!parse_bool(t, &r->s.graph_capture))
                rc = cfg_error(v, "expected true or false, found '%s'", t);
        } else if (!strcmp(k, "shuffle")) {
            if (!parse_bool(t, &r->s.shuffle)) rc = cfg_error(v, "expected true or false, found '%s'", t);
        } else if (!strcmp(k, "tensorboard_histograms")) { /* taken with --tensorboard only */
            if (!parse_bool(t, &r->s.tensorboard_histograms))
                rc = cfg_error(v, "expected true or false, found '%s'", t);
        } else if (!strcmp(k, "amp")) {
            if (strcmp(t, "bf16") && strcmp(t, "fp16") && strcmp(t, "off"))
                rc = cfg_error(v, "expected bf16, fp16 or off, found '%s'", t);
            else /* off: float32 */
                snprintf(r->s.amp, sizeof r->s.amp, "%s", strcmp(t, "off") ? t : "");
        } else if (!strcmp(k, "device") && !r->s.device_given) {
            snprintf(r->s.device, sizeof r->s.device, "%s", t);
        }
        if (rc) return rc;
    }
    return 0;
}

/* ---- data ------------------------------------------------------------------------------- */

static char cfg_dir[PATH_MAX];

/* Collect "options" merged with a split's map into o, as text with its location, so a bad
 * option is reported at its line by the dataset class's own checks. Relative paths are
 * relative to the config file; --data replaces "path". */
static int gather_options(const em_config_node *base, const em_config_node *split,
                          em_options *o) {
    const em_config_node *maps[2] = {base, split}, *pathv = NULL;
    for (int m = 0; m < 2; m++) {
        if (!maps[m]) continue;
        if (em_config_to_options(maps[m], NULL, o) != EM_OK) {
            report_error(NULL);
            return EXIT_USAGE;
        }
        if (em_config_node_kind(maps[m]) == EM_CONFIG_MAP && em_config_node_get(maps[m], "path"))
            pathv = em_config_node_get(maps[m], "path");
    }
    em_status st = EM_OK;
    if (cli_data) {
        st = em_options_set_string(o, "path", cli_data);
    } else if (pathv && em_config_node_text(pathv) && em_config_node_text(pathv)[0] != '/' &&
               cfg_dir[0]) {
        char full[PATH_MAX];
        if ((size_t)snprintf(full, sizeof full, "%.2047s/%.2047s", cfg_dir,
                             em_config_node_text(pathv)) >= sizeof full)
            return cfg_error(pathv, "path too long%s", "");
        st = em_options_set_text(o, "path", full, em_config_node_where(pathv));
    }
    if (st != EM_OK) {
        report_error(NULL);
        return EXIT_USAGE;
    }
    return 0;
}

static int open_set(const char *cls, const em_config_node *base, const em_config_node *split,
                    const em_config_node *at, em_dataset **out) {
    em_options *o = em_options_new();
    if (!o) {
        report_error(NULL);
        return EXIT_USAGE;
    }
    int rc = gather_options(base, split, o);
    if (!rc && !(*out = em_dataset_open(cls, o))) {
        /* option errors already start with the file and line of the value */
        const char *where = em_config_node_where(at), *colon = strchr(where, ':');
        size_t flen = colon ? (size_t)(colon - where) : strlen(where);
        if (strncmp(em_last_error(), where, flen) == 0)
            fprintf(stderr, "ember-train: %s\n", em_last_error());
        else
            fprintf(stderr, "ember-train: %s: %s: %s\n", where, em_config_node_path(at),
                    em_last_error());
        rc = EXIT_USAGE;
    }
    em_options_free(o);
    return rc;
}

static int read_floats(const em_config_node *v, float *out, int cap, int *n) {
    if (em_config_node_kind(v) != EM_CONFIG_LIST || (int)em_config_node_len(v) > cap)
        return cfg_error(v, "expected a list of up to 8 numbers (one per channel)%s", "");
    *n = (int)em_config_node_len(v);
    for (int i = 0; i < *n; i++) {
        double d;
        const em_config_node *e = em_config_node_at(v, (size_t)i, NULL);
        if (!parse_f64(em_config_node_text(e), &d)) return cfg_error(e, "expected a number%s", "");
        out[i] = (float)d;
    }
    return 0;
}

/* One entry of a data.transforms list: "NAME", "NAME: {OPTIONS}" or
 * "{class: NAME, field: F, train_only: B, options: {OPTIONS}}". The class must be registered
 * and the options pass its specs now, so errors name the file and line. */
static int read_transform_entry(run *r, const em_config_node *e) {
    static const char *const keys[] = {"class", "field", "train_only", "options", NULL};
    if (r->n_tspec >= TF_MAX)
        return cfg_error(e, "more than %s transforms in data.transforms", "32");
    const em_config_node *cls = NULL, *opts = NULL, *field = NULL, *only = NULL;
    const char *name = NULL;
    if (em_config_node_kind(e) == EM_CONFIG_SCALAR) {
        name = em_config_node_text(e);
        cls = e;
    } else if (em_config_node_kind(e) == EM_CONFIG_MAP && em_config_node_get(e, "class")) {
        if (em_config_check_keys(e, keys) != EM_OK) {
            report_error(NULL);
            return EXIT_USAGE;
        }
        cls = em_config_node_get(e, "class");
        name = em_config_node_text(cls);
        opts = em_config_node_get(e, "options");
        field = em_config_node_get(e, "field");
        only = em_config_node_get(e, "train_only");
    } else if (em_config_node_kind(e) == EM_CONFIG_MAP && em_config_node_len(e) == 1) {
        opts = em_config_node_at(e, 0, &name);
        cls = e;
    } else {
        return cfg_error(e, "expected a transform class: NAME, NAME: {options}, or {class: NAME, "
                         "field: F, train_only: B, options: {...}}%s", "");
    }
    if (!name || !*name) return cfg_error(cls, "expected a transform class name%s", "");
    const em_transform_class *c = em_transform_class_find(name);
    if (!c) return cfg_error(cls, "%s", em_last_error());
    int k = r->n_tspec;
    r->ttrain_only[k] = false;
    if (only) {
        const char *b = em_config_node_text(only);
        if (!b || !parse_bool(b, &r->ttrain_only[k]))
            return cfg_error(only, "expected true or false%s", "");
    }
    const char *fname = "input";
    if (field && !(fname = em_config_node_text(field)))
        return cfg_error(field, "expected a field name (input)%s", "");
    em_options *o = r->topt[k] = em_options_new();
    if (!o) {
        report_error(NULL);
        return EXIT_USAGE;
    }
    r->n_tspec++;
    if (opts && em_config_node_kind(opts) == EM_CONFIG_SCALAR && em_config_node_text(opts) &&
        em_config_node_text(opts)[0])
        return cfg_error(opts, "expected a map of the transform's options%s", "");
    char owner[128];
    snprintf(owner, sizeof owner, "transform '%s'", name);
    em_options *check = NULL;
    if ((opts && em_config_node_kind(opts) == EM_CONFIG_MAP &&
         em_config_to_options(opts, NULL, o) != EM_OK) ||
        !(check = em_options_copy(o)) ||
        em_options_resolve(check, owner, c->options, c->n_options) != EM_OK) {
        em_options_free(check);
        /* option errors already start with the file and line of the value */
        if (strchr(em_last_error(), ':') && strncmp(em_last_error(), "transform", 9) != 0)
            fprintf(stderr, "ember-train: %s\n", em_last_error());
        else
            return cfg_error(cls, "%s", em_last_error());
        return EXIT_USAGE;
    }
    em_options_free(check);
    r->tspec[k] = (em_transform_spec){.struct_size = sizeof r->tspec[k], .field = fname,
                                      .name = name, .options = o};
    return 0;
}

static int read_transforms(run *r, const em_config_node *t) {
    if (em_config_node_kind(t) == EM_CONFIG_LIST) {
        r->tf = (em_transforms){0}; /* the list says everything, to_float included */
        for (size_t i = 0; i < em_config_node_len(t); i++) {
            int rc = read_transform_entry(r, em_config_node_at(t, i, NULL));
            if (rc) return rc;
        }
        return 0;
    }
    static const char *const keys[] = {"to_float", "scale", "mean", "std", "crop_padding", "hflip",
                                       NULL};
    if (em_config_check_keys(t, keys) != EM_OK) {
        report_error(NULL);
        return EXIT_USAGE;
    }
    int nm = 0, ns = 0, rc;
    for (size_t i = 0; i < em_config_node_len(t); i++) {
        const char *k;
        const em_config_node *v = em_config_node_at(t, i, &k);
        const char *s = em_config_node_text(v);
        int64_t iv;
        if (!strcmp(k, "mean")) {
            if ((rc = read_floats(v, r->tf_mean, 8, &nm))) return rc;
        } else if (!strcmp(k, "std")) {
            if ((rc = read_floats(v, r->tf_std, 8, &ns))) return rc;
        } else if (!s) {
            return cfg_error(v, "expected a value%s", "");
        } else if (!strcmp(k, "to_float") || !strcmp(k, "hflip")) {
            bool b;
            if (!parse_bool(s, &b)) return cfg_error(v, "expected true or false, found '%s'", s);
            if (k[0] == 't') r->tf.to_float = b;
            else r->tf.hflip = b;
        } else if (!strcmp(k, "scale")) {
            if ((rc = cfg_num(N_SCALE, v, &iv, &r->tf.scale))) return rc;
        } else if (!strcmp(k, "crop_padding")) {
            double fv;
            if ((rc = cfg_num(N_CROP, v, &iv, &fv))) return rc;
            r->tf.crop_padding = (int)iv; /* in int's range: the table says so */
        }
    }
    if (nm != ns) return cfg_error(t, "mean and std need one value per channel each%s", "");
    if (nm) {
        r->tf.mean = r->tf_mean;
        r->tf.std = r->tf_std;
        r->tf.n_channels = nm;
    }
    return 0;
}

/* data.inputs (a field name or a list of them) and data.target (a field name): checked
 * against the training set's fields; r->info describes the first input and the target. */
static int read_fields(run *r, const em_config_node *d) {
    const em_config_node *ins = em_config_node_get(d, "inputs");
    const em_config_node *tg = em_config_node_get(d, "target");
    r->n_in = 1;
    r->in_names[0] = "input";
    r->tg_name = "target";
    r->mask_in = -1;
    if (ins && em_config_node_kind(ins) == EM_CONFIG_LIST) {
        size_t n = em_config_node_len(ins);
        if (n < 1 || n > IN_MAX)
            return cfg_error(ins, "expected 1 to 8 field names%s", "");
        r->n_in = (int)n;
        for (size_t i = 0; i < n; i++)
            if (!(r->in_names[i] = em_config_node_text(em_config_node_at(ins, i, NULL))))
                return cfg_error(em_config_node_at(ins, i, NULL), "expected a field name%s", "");
    } else if (ins && !(r->in_names[0] = em_config_node_text(ins))) {
        return cfg_error(ins, "expected a field name or a list of field names%s", "");
    }
    if (tg && !(r->tg_name = em_config_node_text(tg)))
        return cfg_error(tg, "expected a field name%s", "");
    const em_dataset *ds = r->train;
    for (int i = 0; i <= r->n_in; i++) {
        const char *name = i < r->n_in ? r->in_names[i] : r->tg_name;
        const em_config_node *at = i < r->n_in ? (ins ? ins : d) : (tg ? tg : d);
        int k = em_dataset_field_index(ds, name);
        if (k < 0) return cfg_error(at, "%s", em_last_error());
        const em_field *f = em_dataset_field(ds, k);
        if (i == r->n_in && f->variable)
            return cfg_error(at, "the target field '%s' has a variable length; targets are "
                             "fixed fields%s", name);
        if (i < r->n_in && f->variable && r->mask_in < 0) r->mask_in = i;
    }
    const em_field *fi = em_dataset_field(ds, em_dataset_field_index(ds, r->in_names[0]));
    const em_field *ft = em_dataset_field(ds, em_dataset_field_index(ds, r->tg_name));
    em_dataset_info *in = &r->finfo;
    *in = (em_dataset_info){.struct_size = sizeof *in, .length = em_dataset_length(ds),
                            .input_ndim = fi->ndim, .input_dtype = fi->dtype,
                            .target_ndim = ft->ndim, .target_dtype = ft->dtype,
                            .num_classes = ft->num_classes};
    memcpy(in->input_shape, fi->shape, sizeof in->input_shape);
    memcpy(in->target_shape, ft->shape, sizeof in->target_shape);
    if (!(ft->dtype == EM_I64 && ft->ndim <= 1 && ft->num_classes > 0) && ft->dtype != EM_F32)
        return cfg_error(tg ? tg : d, "the target field '%s' must hold int64 class labels (with "
                         "a number of classes; one per item, or (L) one per position) or "
                         "float32 values%s", r->tg_name);
    r->info = in;
    return 0;
}

static int read_data(run *r, const em_config_node *d) {
    static const char *const keys[] = {"class", "options", "train", "validation", "test",
                                       "transforms", "inputs", "target", NULL};
    const em_config_node *root = em_config_root(r->cfg);
    if (!d) return cfg_error(root, "no 'data' section (dataset class, options, splits)%s", "");
    if (em_config_check_keys(d, keys) != EM_OK) {
        report_error(NULL);
        return EXIT_USAGE;
    }
    const em_config_node *cls = em_config_node_get(d, "class");
    if (!cls || !em_config_node_text(cls))
        return cfg_error(d, "'class' (the dataset class, e.g. mnist) is required%s", "");
    const char *cname = em_config_node_text(cls);
    const em_config_node *base = em_config_node_get(d, "options");
    const em_config_node *val = em_config_node_get(d, "validation");
    const em_config_node *test = em_config_node_get(d, "test");
    const em_config_node *tf = em_config_node_get(d, "transforms");
    int rc;
    if ((rc = open_set(cname, base, em_config_node_get(d, "train"), d, &r->train_full))) return rc;
    r->train = r->train_full;
    if (val && em_config_node_kind(val) == EM_CONFIG_SCALAR) {
        double f;
        int64_t count, len = em_dataset_length(r->train_full);
        const char *t = em_config_node_text(val);
        if (parse_i64(t, 1, len - 1, &count)) {
        } else if (parse_f64(t, &f) && f > 0 && f < 1) {
            count = (int64_t)llround(f * (double)len);
            if (count < 1) count = 1;
        } else {
            fprintf(stderr, "ember-train: %s: data.validation: expected a fraction in (0, 1), a "
                    "count in [1, %lld], or a map of dataset options; found '%s'\n",
                    em_config_node_where(val), (long long)len - 1, t);
            return EXIT_USAGE;
        }
        em_dataset *parts[2];
        int64_t lens[2] = {len - count, count};
        if (em_random_split(r->train_full, lens, 2, r->s.seed, parts) != EM_OK) {
            report_error("data.validation");
            return EXIT_USAGE;
        }
        r->train = parts[0];
        r->val = parts[1];
    } else if (val) {
        if ((rc = open_set(cname, base, val, val, &r->val))) return rc;
    }
    if (test && (rc = open_set(cname, base, test, test, &r->test))) return rc;
    if ((rc = read_fields(r, d))) return rc;
    /* the 1.0 default: uint8 items of the field "input" become float32 */
    if (!strcmp(r->in_names[0], "input") && r->info->input_dtype == EM_U8) r->tf.to_float = true;
    if (tf && (rc = read_transforms(r, tf))) return rc;
    return 0;
}

/* ---- optimizer, frozen parameters, scheduler -------------------------------------------- */

typedef struct owner_map {
    char paths[512][128];
    const char *classes[512];
    int n;
} owner_map;

static em_status collect_owner(em_module *m, const char *path, void *user) {
    owner_map *om = user;
    if (om->n < 512) {
        snprintf(om->paths[om->n], sizeof om->paths[0], "%s", path);
        om->classes[om->n++] = em_module_class_of(m)->name;
    }
    return EM_OK;
}

static const char *owner_class(const owner_map *om, const char *param) {
    char p[128];
    snprintf(p, sizeof p, "%s", param);
    char *dot = strrchr(p, '.');
    if (dot) *dot = '\0';
    else p[0] = '\0';
    for (int i = 0; i < om->n; i++)
        if (!strcmp(om->paths[i], p)) return om->classes[i];
    return "";
}

static bool list_has(const em_config_node *l, const char *s, bool glob) {
    if (!l) return false;
    if (em_config_node_kind(l) == EM_CONFIG_SCALAR) {
        const char *t = em_config_node_text(l);
        return glob ? fnmatch(t, s, 0) == 0 : strcmp(t, s) == 0;
    }
    for (size_t i = 0; i < em_config_node_len(l); i++) {
        const char *t = em_config_node_text(em_config_node_at(l, i, NULL));
        if (t && (glob ? fnmatch(t, s, 0) == 0 : strcmp(t, s) == 0)) return true;
    }
    return false;
}

static int read_frozen(run *r, const em_config_node *fz) {
    if (!fz) return 0;
    if (em_config_node_kind(fz) == EM_CONFIG_MAP)
        return cfg_error(fz, "expected a list of parameter-name prefixes%s", "");
    size_t n = em_config_node_kind(fz) == EM_CONFIG_LIST ? em_config_node_len(fz) : 1;
    for (size_t i = 0; i < n; i++) {
        const em_config_node *e = em_config_node_kind(fz) == EM_CONFIG_LIST
                                      ? em_config_node_at(fz, i, NULL) : fz;
        const char *t = em_config_node_text(e);
        if (!t) return cfg_error(e, "expected a prefix%s", "");
        int count = 0;
        if (em_module_freeze(r->model, t, true, &count) != EM_OK) {
            fprintf(stderr, "ember-train: %s: frozen: %s\n", em_config_node_where(e),
                    em_last_error());
            return EXIT_USAGE;
        }
    }
    return 0;
}

static int build_optimizer(run *r, const em_config_node *o) {
    static const char *const group_skip[] = {"params", "classes", NULL};
    static const char *const top_skip[] = {"class", "groups", NULL};
    const char *cls = "SGD";
    const em_config_node *groups = NULL;
    if (o) {
        if (em_config_node_kind(o) != EM_CONFIG_MAP)
            return cfg_error(o, "expected a map: class, groups and the optimizer's options%s", "");
        const em_config_node *c = em_config_node_get(o, "class");
        if (c && em_config_node_text(c)) cls = em_config_node_text(c);
        groups = em_config_node_get(o, "groups");
    }
    if (cli_optimizer) cls = cli_optimizer;
    if (!em_optim_class_find(cls)) {
        char names[512] = "";
        size_t used = 0;
        for (size_t i = 0; i < em_optim_class_count() && used < sizeof names; i++)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                                     em_optim_class_get(i)->name);
        em_set_error(EM_ERR_NOTFOUND, "no optimizer class named '%s'; registered: %s", cls, names);
        located_error(o, "optimizer");
        return EXIT_USAGE;
    }
    em_options *defaults = em_options_new();
    if (o && em_config_to_options(o, top_skip, defaults) != EM_OK) {
        em_options_free(defaults);
        report_error(NULL);
        return EXIT_USAGE;
    }
    if (!o && !em_options_has(defaults, "lr")) em_options_set_float(defaults, "lr", 0.01);
    if (!isnan(cli_lr)) em_options_set_float(defaults, "lr", cli_lr);
    if (!isnan(cli_momentum)) em_options_set_float(defaults, "momentum", cli_momentum);
    if (!isnan(cli_wd)) em_options_set_float(defaults, "weight_decay", cli_wd);

    owner_map *om = calloc(1, sizeof *om);
    em_module_apply(r->model, collect_owner, om);
    em_dict *all = em_module_named_parameters(r->model, true);
    size_t ng = groups ? em_config_node_len(groups) : 0;
    if (groups && em_config_node_kind(groups) != EM_CONFIG_LIST) {
        free(om);
        em_options_free(defaults);
        em_dict_free(all);
        return cfg_error(groups, "expected a list of groups, each with params (name patterns) "
                         "and/or classes (module classes) and options%s", "");
    }
    em_dict **gd = calloc(ng + 1, sizeof *gd);
    em_options **go = calloc(ng + 1, sizeof *go);
    em_param_group *pg = calloc(ng + 1, sizeof *pg);
    int rc = 0;
    for (size_t g = 0; g <= ng; g++) gd[g] = em_dict_new();
    for (size_t g = 0; g < ng && !rc; g++) {
        const em_config_node *gn = em_config_node_at(groups, g, NULL);
        if (em_config_node_kind(gn) != EM_CONFIG_MAP ||
            (!em_config_node_get(gn, "params") && !em_config_node_get(gn, "classes"))) {
            rc = cfg_error(gn, "a group needs 'params' (parameter-name patterns such as "
                           "'*.bias') or 'classes' (module classes such as BatchNorm2d)%s", "");
            break;
        }
        go[g] = em_options_new();
        if (em_config_to_options(gn, group_skip, go[g]) != EM_OK) {
            report_error(NULL);
            rc = EXIT_USAGE;
        }
    }
    /* Each parameter goes to the first group that selects it; the rest to the last group
     * (the optimizer's defaults). */
    for (size_t i = 0; i < em_dict_len(all) && !rc; i++) {
        const char *name = em_dict_key(all, i);
        size_t g = 0;
        for (; g < ng; g++) {
            const em_config_node *gn = em_config_node_at(groups, g, NULL);
            if (list_has(em_config_node_get(gn, "params"), name, true) ||
                list_has(em_config_node_get(gn, "classes"), owner_class(om, name), false))
                break;
        }
        em_dict_set(gd[g], name, em_dict_value(all, i));
    }
    int n_pg = 0;
    for (size_t g = 0; g < ng && !rc; g++) {
        if (em_dict_len(gd[g]) == 0) {
            const em_config_node *gn = em_config_node_at(groups, g, NULL);
            char names[512] = "";
            size_t used = 0;
            for (size_t i = 0; i < em_dict_len(all) && used < sizeof names; i++)
                used += (size_t)snprintf(names + used, sizeof names - used, "%s%s",
                                         i ? ", " : "", em_dict_key(all, i));
            fprintf(stderr, "ember-train: %s: %s selects no parameter; the trainable "
                    "parameters are: %s\n", em_config_node_where(gn), em_config_node_path(gn),
                    names);
            rc = EXIT_USAGE;
            break;
        }
        pg[n_pg++] = (em_param_group){gd[g], go[g]};
    }
    if (!rc && em_dict_len(gd[ng])) pg[n_pg++] = (em_param_group){gd[ng], NULL};
    if (!rc && n_pg == 0) {
        fprintf(stderr, "ember-train: the model has no trainable parameters\n");
        rc = EXIT_USAGE;
    }
    if (!rc && !(r->opt = em_optimizer_new_groups_defaults(cls, pg, n_pg, defaults))) {
        located_error(o, "optimizer");
        rc = EXIT_USAGE;
    }
    r->params = all;
    for (size_t g = 0; g <= ng; g++) {
        em_dict_free(gd[g]);
        em_options_free(go[g]);
    }
    free(gd);
    free(go);
    free(pg);
    free(om);
    em_options_free(defaults);
    return rc;
}

/* Optimizer steps per epoch as the loop will run them (the warm-up of a per-step schedule). */
static int64_t steps_per_epoch(const run *r) {
    int64_t len = em_dataset_length(r->train), B = r->s.batch_size;
    if (r->s.overfit_batches && r->s.overfit_batches <= len / B) len = r->s.overfit_batches * B;
    len = (len + r->d.world - 1) / r->d.world; /* data-parallel: a rank's shard (padded) */
    int64_t nb = len / B + (len % B != 0);
    if (r->s.limit_batches && r->s.limit_batches < nb) nb = r->s.limit_batches;
    return nb / r->s.accum_steps + (nb % r->s.accum_steps != 0);
}

/* The warm-up: LinearLR from lr/(W+1) to lr over W epochs (or W epochs' steps), then the
 * configured scheduler — PyTorch's SequentialLR([LinearLR, sched], milestones=[W]), built
 * through the registry so checkpoints keep its state like any scheduler's. `o` holds the
 * configured scheduler's options (already checked by creating it once). */
static em_scheduler *warmup_scheduler(run *r, const em_sched_class *k, const em_options *o,
                                      int64_t W) {
    char text[2048];
    size_t used = (size_t)snprintf(text, sizeof text, "LinearLR(start_factor=%.17g, "
                                   "end_factor=1, total_iters=%lld)", 1.0 / (double)(W + 1),
                                   (long long)W);
    em_options *so = em_options_new();
    if (!so) return NULL;
    em_scheduler *s = NULL;
    if (!k) {
        /* a warm-up, then the lr stays where it ends: LinearLR alone */
        em_options_set_float(so, "start_factor", 1.0 / (double)(W + 1));
        em_options_set_float(so, "end_factor", 1.0);
        em_options_set_int(so, "total_iters", W);
        s = em_scheduler_new("LinearLR", r->opt, so);
        em_options_free(so);
        return s;
    }
    used += (size_t)snprintf(text + used, sizeof text - used, ", %s(", k->name);
    for (size_t i = 0; i < em_options_count(o) && used < sizeof text; i++) {
        char v[512];
        em_options_text(o, i, v, sizeof v);
        if (strpbrk(v, ",()") && !(v[0] == '[' && !strpbrk(v, "()"))) {
            em_set_error(EM_ERR_INVALID, "warm-up: %s's option %s='%s' cannot be passed on to "
                         "SequentialLR (a ',' or parenthesis in a value)", k->name,
                         em_options_name(o, i), v);
            em_options_free(so);
            return NULL;
        }
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%s=%s", i ? ", " : "",
                                 em_options_name(o, i), v);
    }
    if (used < sizeof text) used += (size_t)snprintf(text + used, sizeof text - used, ")");
    if (used >= sizeof text) {
        em_set_error(EM_ERR_INVALID, "warm-up: %s's options are too long", k->name);
        em_options_free(so);
        return NULL;
    }
    if (em_options_set_string(so, "schedulers", text) == EM_OK &&
        em_options_set_ints(so, "milestones", 1, &W) == EM_OK)
        s = em_scheduler_new("SequentialLR", r->opt, so);
    em_options_free(so);
    return s;
}

/* A schedule longer than the run: the lr never reaches where the schedule ends (a cosine's
 * eta_min, OneCycleLR's final annealing, LinearLR's end_factor). `warmup`: the warm-up before
 * it, in the schedule's units (epochs, or steps when per_step). A warning, naming both. */
static void warn_short_schedule(const run *r, const em_sched_class *k, const em_options *o,
                                bool per_step, int64_t warmup) {
    const char *key = !strcmp(k->name, "CosineAnnealingLR") ? "T_max"
                      : !strcmp(k->name, "OneCycleLR")      ? "total_steps"
                      : !strcmp(k->name, "LinearLR")        ? "total_iters" : NULL;
    em_options *c = key ? em_options_copy(o) : NULL;
    if (!c || em_options_resolve(c, k->name, k->options, k->n_options) != EM_OK) {
        em_options_free(c);
        return; /* the scheduler was made from the same options: not reached */
    }
    int64_t len = em_options_int(c, key);
    if (!strcmp(key, "total_steps") && len == 0)
        len = em_options_int(c, "epochs") * em_options_int(c, "steps_per_epoch");
    em_options_free(c);
    int64_t spe = steps_per_epoch(r), run_len = r->s.epochs;
    if (per_step && __builtin_mul_overflow(r->s.epochs, spe, &run_len)) return;
    if (run_len - warmup >= len) return;
    const char *unit = per_step ? "step" : "epoch";
    char runs[96];
    if (per_step)
        snprintf(runs, sizeof runs, "%lld epochs of %lld steps (%lld steps)", (long long)r->s.epochs,
                 (long long)spe, (long long)run_len);
    else
        snprintf(runs, sizeof runs, "%lld epochs", (long long)r->s.epochs);
    char wu[64] = "";
    if (warmup) snprintf(wu, sizeof wu, " after a warm-up of %lld %ss", (long long)warmup, unit);
    warn(r, "ember-train: warning: the run's %s (--epochs) end before the schedule does: "
            "%s's %s is %lld %ss%s, so the lr stops part-way (raise --epochs to %lld, or shorten "
            "%s)\n", runs, k->name, key, (long long)len, unit, wu,
            (long long)(per_step ? (len + warmup + spe - 1) / spe : len + warmup), key);
}

static int build_scheduler(run *r, const em_config_node *sc) {
    static const char *const skip[] = {"class", "interval", "warmup_epochs", NULL};
    const char *cls = NULL, *interval = NULL;
    int64_t warmup = 0;
    const em_config_node *wnode = NULL;
    if (sc) {
        if (em_config_node_kind(sc) != EM_CONFIG_MAP)
            return cfg_error(sc, "expected a map: class, interval (step|epoch), warmup_epochs "
                             "and options%s", "");
        const em_config_node *c = em_config_node_get(sc, "class");
        const em_config_node *iv = em_config_node_get(sc, "interval");
        cls = c ? em_config_node_text(c) : NULL;
        if (iv) {
            interval = em_config_node_text(iv);
            if (!interval || (strcmp(interval, "step") && strcmp(interval, "epoch")))
                return cfg_error(iv, "interval: expected 'step' or 'epoch'%s", "");
        }
        if ((wnode = em_config_node_get(sc, "warmup_epochs"))) {
            double fv;
            int rc = cfg_num(N_WARMUP, wnode, &warmup, &fv);
            if (rc) return rc;
        }
        if (!cls && !cli_scheduler && !wnode)
            return cfg_error(sc, "'class' is required (or warmup_epochs alone: a warm-up, then "
                             "a constant lr)%s", "");
    }
    if (cli_scheduler) cls = cli_scheduler;
    if (cli_warmup >= 0) warmup = cli_warmup;
    if (!cls && !warmup) return 0;
    const em_sched_class *k = cls ? em_sched_class_find(cls) : NULL;
    if (cls && !k) {
        char names[512] = "";
        size_t used = 0;
        for (size_t i = 0; i < em_sched_class_count() && used < sizeof names; i++)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                                     em_sched_class_get(i)->name);
        em_set_error(EM_ERR_NOTFOUND, "no scheduler class named '%s'; registered: %s", cls, names);
        located_error(sc, "scheduler");
        return EXIT_USAGE;
    }
    if (warmup && k && (!strcmp(k->name, "SequentialLR") || !strcmp(k->name, "OneCycleLR") ||
                        !strcmp(k->name, "ReduceLROnPlateau"))) {
        fprintf(stderr, "ember-train: %s%sa warm-up (--warmup-epochs / warmup_epochs) does not "
                "combine with %s: %s\n", sc ? em_config_node_where(sc) : "", sc ? ": " : "",
                k->name,
                !strcmp(k->name, "SequentialLR") ? "make the warm-up its first sub-scheduler"
                : !strcmp(k->name, "OneCycleLR") ? "it warms up itself (pct_start)"
                : "it steps on a metric, which SequentialLR does not pass on (as in PyTorch)");
        return EXIT_USAGE;
    }
    em_options *o = em_options_new();
    if (sc && em_config_to_options(sc, skip, o) != EM_OK) {
        em_options_free(o);
        report_error(NULL);
        return EXIT_USAGE;
    }
    bool per_step = !strcmp(interval ? interval : (k && k->interval ? k->interval : "epoch"), "step");
    if (warmup && k) {
        /* Create the configured scheduler once on its own, so that a bad option is reported at
         * its place in the config; then give the optimizer its lrs back. */
        int ng = em_optimizer_group_count(r->opt);
        double *lrs = calloc((size_t)ng, sizeof *lrs);
        for (int g = 0; lrs && g < ng; g++) lrs[g] = em_optimizer_lr(r->opt, g);
        em_scheduler *probe = lrs ? em_scheduler_new(cls, r->opt, o) : NULL;
        for (int g = 0; lrs && g < ng; g++) em_optimizer_set_lr(r->opt, g, lrs[g]);
        free(lrs);
        if (!probe) {
            em_options_free(o);
            located_error(sc, "scheduler");
            return EXIT_USAGE;
        }
        em_scheduler_free(probe);
    }
    if (warmup) {
        int64_t W = warmup;
        if (per_step && __builtin_mul_overflow(warmup, steps_per_epoch(r), &W)) {
            fprintf(stderr, "ember-train: %s%sa warm-up of %lld epochs of %lld steps is more "
                    "steps than can be counted\n", wnode ? em_config_node_where(wnode) : "",
                    wnode ? ": " : "", (long long)warmup, (long long)steps_per_epoch(r));
            em_options_free(o);
            return EXIT_USAGE;
        }
        r->sched = warmup_scheduler(r, k, o, W);
        if (r->sched)
            say(r, "ember-train: linear lr warm-up over %lld epoch%s%s, then %s\n",
                (long long)warmup, warmup == 1 ? "" : "s", per_step ? " (per step)" : "",
                k ? k->name : "a constant lr");
    } else {
        r->sched = em_scheduler_new(cls, r->opt, o);
    }
    if (!r->sched) {
        em_options_free(o);
        located_error(sc, "scheduler");
        return EXIT_USAGE;
    }
    r->sched_per_step = per_step;
    if (k) warn_short_schedule(r, k, o, per_step, warmup && per_step ? warmup * steps_per_epoch(r) : warmup);
    em_options_free(o);
    return 0;
}

/* ---- the model fits the data: one eval-mode forward of zeros, and the loss ------------- */

static const char *last_leaf_class(em_module *m) {
    size_t n = em_module_child_count(m);
    if (n == 0) return em_module_class_of(m)->name;
    if (strcmp(em_module_class_of(m)->name, "Sequential")) return em_module_class_of(m)->name;
    return last_leaf_class(em_module_child_at(m, n - 1, NULL));
}

static int check_fit(run *r) {
    const em_dataset_info *in = r->info;
    /* the warnings first: they also explain a loss that does not fit */
    const char *last = last_leaf_class(r->model);
    if ((!strcmp(last, "Softmax") || !strcmp(last, "LogSoftmax")) &&
        !strcmp(r->loss_class, "CrossEntropyLoss"))
        warn(r, "ember-train: warning: the model ends in %s and the loss is "
                "CrossEntropyLoss, which applies log_softmax itself: remove the %s (or use "
                "NLLLoss after LogSoftmax)\n", last, last);
    if (in->num_classes > 0 && in->target_ndim == 0 &&
        (!strcmp(r->loss_class, "MSELoss") || !strcmp(r->loss_class, "L1Loss") ||
         !strcmp(r->loss_class, "SmoothL1Loss")))
        warn(r, "ember-train: warning: %s on class-index targets treats the labels as "
                "numbers; use CrossEntropyLoss for classification\n", r->loss_class);
    /* what the training loader delivers: each input field through data.transforms (a
     * variable-length one at its longest, with a mask of real positions only) */
    em_transform_layout items[IN_MAX];
    for (int k = 0; k < r->n_in; k++) {
        const em_field *f = em_dataset_field(r->train, em_dataset_field_index(r->train,
                                                                             r->in_names[k]));
        em_transform_layout *item = &items[k];
        bool legacy = !strcmp(r->in_names[k], "input") && r->tf.to_float;
        *item = (em_transform_layout){.struct_size = sizeof *item, .ndim = f->ndim,
                                      .dtype = legacy ? EM_F32 : f->dtype};
        memcpy(item->shape, f->shape, sizeof item->shape);
        if (r->n_tspec) {
            em_transform_layout raw = *item;
            raw.dtype = f->dtype;
            if (em_transform_specs_layout(r->tspec, r->n_tspec, r->in_names[k], &raw, item) !=
                EM_OK) {
                const em_config_node *d = em_config_node_get(em_config_root(r->cfg), "data");
                fprintf(stderr, "ember-train: %s: data.transforms: %s\n",
                        em_config_node_where(em_config_node_get(d, "transforms")),
                        em_last_error());
                return EXIT_USAGE;
            }
        }
    }
    const em_transform_layout item = items[0];
    int64_t shape[EM_MAX_DIMS + 1] = {2};
    for (int i = 0; i < item.ndim; i++) shape[i + 1] = item.shape[i];
    int rc = 0;
    em_scope_begin();
    em_grad_mode_push(EM_GRAD_DISABLED);
    em_module_train(r->model, false);
    em_tensor *xs[IN_MAX];
    /* An int64 field of ids in [0, num_classes) (a text's tokens) is fed its largest id, so
     * that an Embedding smaller than the data's vocabulary fails here, before training,
     * instead of at the first batch holding a high id. */
    int64_t top_id[IN_MAX];
    for (int k = 0; k < r->n_in; k++) {
        const em_field *f = em_dataset_field(r->train, em_dataset_field_index(r->train,
                                                                             r->in_names[k]));
        top_id[k] = !r->n_tspec && f->dtype == EM_I64 && items[k].dtype == EM_I64 &&
                            f->num_classes > 0
                        ? f->num_classes - 1
                        : -1;
        int64_t sk[EM_MAX_DIMS + 1] = {2};
        for (int i = 0; i < items[k].ndim; i++) sk[i + 1] = items[k].shape[i];
        xs[k] = top_id[k] > 0 ? em_full(items[k].ndim + 1, sk, (double)top_id[k], EM_I64, r->dev)
                              : em_zeros(items[k].ndim + 1, sk, items[k].dtype, r->dev);
    }
    em_tensor *x = xs[0], *mask = NULL;
    if (r->mask_in >= 0) {
        const em_field *f = em_dataset_field(r->train, em_dataset_field_index(
                                                           r->train, r->in_names[r->mask_in]));
        int64_t ms[2] = {2, f->shape[f->var_dim]};
        mask = em_full(2, ms, 1, EM_BOOL, r->dev);
    }
    em_tensor *y;
    if (in->target_ndim == 0) {
        y = em_zeros(1, shape, EM_I64, r->dev);
    } else {
        int64_t ts[EM_MAX_DIMS + 1] = {2};
        for (int i = 0; i < in->target_ndim; i++) ts[i + 1] = in->target_shape[i];
        y = em_zeros(in->target_ndim + 1, ts, in->target_dtype, r->dev);
    }
    /* A forward of two throwaway items, run in deterministic mode so that the CPU backend
     * does not autotune its products (the choice changes no bits, only the time): the batches
     * seldom have this shape, and as the process's first tuned product it also ran the
     * tuner's warm-up, all threads against 1 thread in turn until all threads win, which on a
     * 2-row product they seldom do: up to its 100 ms on the shape that needs it least, and
     * the training shapes were then tuned without it. The warm-up now runs at the first
     * training product (bench/README.md, "A whole training process"). */
    const bool det = em_deterministic();
    em_set_deterministic(true);
    em_tensor *out = x ? em_module_forward_masked(r->model, xs, r->n_in, mask) : NULL;
    char xsh[128];
    em_shape_str(item.ndim + 1, shape, xsh, sizeof xsh);
    if (!out) {
        fprintf(stderr, "ember-train: the model does not fit the data (input %s from %s): %s\n",
                xsh, em_dataset_name(r->train), em_last_error());
        for (int k = 0; k < r->n_in; k++)
            if (top_id[k] >= 0)
                fprintf(stderr, "  the data's field '%s' holds ids 0..%lld (%lld classes: its "
                        "vocabulary); an Embedding of it needs num_embeddings >= %lld\n",
                        r->in_names[k], (long long)top_id[k], (long long)top_id[k] + 1,
                        (long long)top_id[k] + 1);
        rc = EXIT_USAGE;
    } else {
        bool seq = sequence_targets(r);
        int cd = seq ? 2 : 1; /* the class dim of the output: (B, C), or (B, L, C) */
        if (!loss_forward(r, out, y)) {
            char os[128];
            em_shape_str(em_tensor_ndim(out), em_tensor_shape(out), os, sizeof os);
            fprintf(stderr, "ember-train: the model's output %s does not fit the loss %s and "
                    "the targets (%s, %lld classes): %s\n", os, r->loss_class,
                    seq ? "class indices per position" : in->target_ndim == 0 ? "class indices"
                                                                             : "float values",
                    (long long)in->num_classes, em_last_error());
            rc = EXIT_USAGE;
        } else if (in->num_classes > 0 && em_tensor_ndim(out) == cd + 1 &&
                   em_tensor_shape(out)[cd] != in->num_classes &&
                   !strcmp(r->loss_class, "CrossEntropyLoss")) {
            fprintf(stderr, "ember-train: the model gives %lld outputs per %s but the data "
                    "has %lld classes%s: its last layer needs %lld outputs\n",
                    (long long)em_tensor_shape(out)[cd], seq ? "position" : "sample",
                    (long long)in->num_classes, seq ? " (ids per position: its vocabulary)" : "",
                    (long long)in->num_classes);
            rc = EXIT_USAGE;
        }
    }
    em_set_deterministic(det);
    em_module_train(r->model, true);
    em_grad_mode_pop();
    em_scope_end();
    return rc;
}

/* ---- --list-plugins ----------------------------------------------------------------------- */

static void list_plugins(void) {
    printf("plugin search path: %s\n", em_plugin_search_path());
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info pi;
        if (em_plugin_get(i, &pi) != EM_OK) continue;
        printf("  %-14s %-8s %s%s%s\n", pi.name ? pi.name : "?",
               pi.status == EM_PLUGIN_LOADED ? "loaded" : "refused", pi.path,
               pi.reason ? ": " : "", pi.reason ? pi.reason : "");
    }
    printf("module classes:");
    for (size_t i = 0; i < em_module_class_count(); i++)
        printf(" %s", em_module_class_get(i)->name);
    printf("\noptimizers:");
    for (size_t i = 0; i < em_optim_class_count(); i++) printf(" %s", em_optim_class_get(i)->name);
    printf("\nschedulers:");
    for (size_t i = 0; i < em_sched_class_count(); i++) printf(" %s", em_sched_class_get(i)->name);
    printf("\ndataset classes:");
    for (size_t i = 0; i < em_dataset_class_count(); i++) printf(" %s", em_dataset_class_name(i));
    printf("\n");
}

/* ---- main ---------------------------------------------------------------------------------- */

static const char *default_config(void) {
    static char buf[PATH_MAX];
    const char *env = getenv("EMBER_EXAMPLES_DIR");
    const char *dirs[] = {env, "examples", EM_SRCDIR "/examples", EM_DATADIR "/examples"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        if (!dirs[i]) continue;
        snprintf(buf, sizeof buf, "%s/digits.yaml", dirs[i]);
        if (access(buf, R_OK) == 0) return buf;
    }
    return NULL;
}

/* The files the run will write, checked before anything is built (so a typo costs no epoch):
 * --checkpoint's pattern (one "{step}", in the file name, and no other "{...}") and that its
 * directory takes a new file; the same for --save-weights and --save-best. --metrics,
 * --metrics-steps and --predict are opened before the first step. */
static int check_outputs(const run *r) {
    const struct { const char *option, *path; } out[] = {{"--checkpoint", r->s.checkpoint},
                                                        {"--save-weights", r->s.save_weights},
                                                        {"--save-best", r->s.save_best},
                                                        {"--trace", r->s.trace},
                                                        {"--plot", r->s.plot},
                                                        {"--export-onnx", r->s.export_onnx}};
    for (size_t i = 0; i < sizeof out / sizeof *out; i++) {
        const char *p = out[i].path;
        if (!p) continue;
        char first[4096];
        const char *tok = strstr(p, "{step}");
        if (i == 0 && tok) {
            if (em_checkpoint_path(p, 0, first, sizeof first) != EM_OK) {
                fprintf(stderr, "ember-train: --checkpoint %s: %s\n", p, em_last_error());
                return EXIT_USAGE;
            }
        } else {
            snprintf(first, sizeof first, "%s", p);
            tok = NULL;
        }
        for (const char *b = p; *b; b++) {
            if (b == tok) {
                b += strlen("{step}") - 1;
                continue;
            }
            if (*b != '{' && *b != '}') continue;
            const char *e = *b == '{' ? strchr(b, '}') : NULL;
            fprintf(stderr, "ember-train: %s %s: '%.*s' is not a placeholder ember-train fills%s\n",
                    out[i].option, p, e ? (int)(e - b + 1) : 1, b,
                    i == 0 ? "; the only one is {step}, the step number, in the file name"
                           : " (only --checkpoint takes {step})");
            return EXIT_USAGE;
        }
        if (em_save_check(first) != EM_OK) {
            fprintf(stderr, "ember-train: %s %s: %s\n", out[i].option, p, em_last_error());
            return EXIT_USAGE;
        }
    }
    return 0;
}

static void free_run(run *r) {
    em_grad_scaler_free(r->scaler);
    em_profiler_free(r->profiler);
    em_scheduler_free(r->sched);
    em_optimizer_free(r->opt);
    em_dict_free(r->params);
    em_module_free(r->loss);
    em_module_free(r->model);
    if (r->train != r->train_full) em_dataset_free(r->train);
    em_dataset_free(r->val);
    em_dataset_free(r->test);
    em_dataset_free(r->train_full);
    for (int i = 0; i < r->n_tspec; i++) em_options_free(r->topt[i]);
    em_config_free(r->cfg);
}

/* The config's "plugins: [PATH, ...]": plugin files the model or data need, loaded before
 * anything is built; a relative path is the config file's directory's. NULL: none. */
static int load_config_plugins(const em_config_node *list) {
    if (!list) return 0;
    if (em_config_node_kind(list) != EM_CONFIG_LIST)
        return cfg_error(list, "expected a list of plugin files (plugins: [path/to/plugin.so])%s",
                         "");
    for (size_t i = 0; i < em_config_node_len(list); i++) {
        const em_config_node *e = em_config_node_at(list, i, NULL);
        const char *p = em_config_node_text(e);
        if (!p || !*p) return cfg_error(e, "expected a plugin file's path%s", "");
        char full[PATH_MAX];
        int n = p[0] == '/' || !*cfg_dir ? snprintf(full, sizeof full, "%s", p)
                                         : snprintf(full, sizeof full, "%s/%s", cfg_dir, p);
        if (n < 0 || (size_t)n >= sizeof full) return cfg_error(e, "the path is too long%s", "");
        if (em_plugin_load(full) != EM_OK) return cfg_error(e, "%s", em_last_error());
    }
    return 0;
}

static int setup(run *r) {
    if (!(r->cfg = em_config_load(r->s.config_path))) {
        report_error(NULL);
        return EXIT_USAGE;
    }
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", r->s.config_path);
    snprintf(cfg_dir, sizeof cfg_dir, "%s", dirname(tmp));
    static const char *const top[] = {"model", "data", "loss", "optimizer", "scheduler", "frozen",
                                      "loop", "plugins", NULL};
    const em_config_node *root = em_config_root(r->cfg);
    if (em_config_check_keys(root, top) != EM_OK) {
        report_error(NULL);
        return EXIT_USAGE;
    }
    int rc = load_config_plugins(em_config_node_get(root, "plugins"));
    return rc ? rc : read_loop(r, em_config_node_get(root, "loop"));
}

/* What every rank of a data-parallel run must share, checked before anything is built: the
 * config file's bytes, the options that shape the data, the model, the optimizer and what the
 * run does (a rank that evaluates while the others train would wait for them forever). */
static int check_ranks_agree(run *r, int n_plugins) {
    if (!r->d.comm) return 0;
#define I(n, v) {n, (int64_t)(v), DDP_INT}
#define T(n, v) {n, ddp_hash_text(v), DDP_HASH}
    int64_t cfg = ddp_hash_file(r->s.config_path);
    const settings *st = &r->s;
    ddp_setting set[] = {
        {"config file", cfg, DDP_HASH},
        T("--data", cli_data), T("--device", st->device), T("--optimizer", cli_optimizer),
        T("--scheduler", cli_scheduler), T("--init-weights", st->init_weights),
        T("--resume", st->resume), T("--predict", st->predict),
        I("--epochs (loop.epochs)", st->epochs), I("--max-steps (loop.max_steps)", st->max_steps),
        I("--batch-size (loop.batch_size)", st->batch_size),
        I("--accum-steps (loop.accum_steps)", st->accum_steps),
        I("--eval-batch-size (loop.eval_batch_size)", st->eval_batch_size),
        I("--limit-batches (loop.limit_batches)", st->limit_batches),
        I("--overfit-batches (loop.overfit_batches)", st->overfit_batches),
        I("--early-stop (loop.early_stop)", st->early_stop), I("--seed (loop.seed)", st->seed),
        I("--no-shuffle (loop.shuffle)", !st->shuffle),
        I("--deterministic (loop.deterministic)", st->deterministic),
        I("--warmup-epochs", cli_warmup), I("--eval-only", st->eval_only),
        I("--dry-run", st->dry_run), I("--summary", st->summary),
        I("--init-weights-nonstrict", st->init_nonstrict), I("--sync-batchnorm", st->sync_batchnorm),
        I("the number of --plugin options", n_plugins),
        /* saves are collective (rank 0 writes, every rank hears how it went) */
        I("--checkpoint", st->checkpoint != NULL), I("--save-best", st->save_best != NULL),
        I("--save-weights", st->save_weights != NULL),
        I("--export-onnx", st->export_onnx != NULL), T("--init-onnx", st->init_onnx),
        T("--amp (loop.amp)", st->amp),
        {"--clip-grad-norm (loop.clip_grad_norm)", 0, DDP_REAL}, {"--lr", 0, DDP_REAL},
        {"--momentum", 0, DDP_REAL}, {"--weight-decay", 0, DDP_REAL},
        {"--ddp-bucket-mib", 0, DDP_REAL},
    };
#undef I
#undef T
    const double reals[] = {st->clip_grad_norm, cli_lr, cli_momentum, cli_wd, st->ddp_bucket_mib};
    int n = (int)(sizeof set / sizeof *set), nr = (int)(sizeof reals / sizeof *reals);
    for (int i = 0; i < nr; i++) memcpy(&set[n - nr + i].value, &reals[i], sizeof(double));
    return ddp_check_same(r, set, n);
}

int main(int argc, char **argv) {
    enum { O_DATA = 256, O_DEVICE, O_EPOCHS, O_MAX_STEPS, O_BATCH, O_LR, O_OPTIM, O_MOMENTUM,
           O_WD, O_SCHED, O_ACCUM, O_CLIP, O_SEED, O_DETERM, O_WORKERS, O_NOSHUF, O_INIT,
           O_INIT_NS, O_SAVE, O_CKPT, O_KEEP, O_RESUME, O_METRICS, O_EVAL, O_PREDICT, O_LIMIT,
           O_OVERFIT, O_SUMMARY, O_MEMSUM, O_PROFILE, O_ANOMALY, O_DRY, O_LIST, O_HELP,
           O_VERSION, O_WARMUP, O_EARLY, O_PLUGIN, O_QUIET, O_LOG_EVERY, O_METRICS_STEPS,
           O_SAVE_BEST, O_PREDICT_SCORES, O_EVAL_BATCH, O_TENSORBOARD, O_TB_HIST, O_GENERATE,
           O_PROMPT, O_TEMPERATURE, O_TOP_K, O_TRACE, O_PLOT, O_AMP, O_EXPORT_ONNX, O_INIT_ONNX,
           O_BUCKET, O_SYNC_BN, O_GRAPH };
    static const struct option longopts[] = {
        {"data", 1, 0, O_DATA}, {"device", 1, 0, O_DEVICE}, {"epochs", 1, 0, O_EPOCHS},
        {"max-steps", 1, 0, O_MAX_STEPS}, {"batch-size", 1, 0, O_BATCH}, {"lr", 1, 0, O_LR},
        {"optimizer", 1, 0, O_OPTIM}, {"momentum", 1, 0, O_MOMENTUM},
        {"weight-decay", 1, 0, O_WD}, {"scheduler", 1, 0, O_SCHED},
        {"accum-steps", 1, 0, O_ACCUM}, {"clip-grad-norm", 1, 0, O_CLIP}, {"seed", 1, 0, O_SEED},
        {"deterministic", 0, 0, O_DETERM}, {"workers", 1, 0, O_WORKERS},
        {"no-shuffle", 0, 0, O_NOSHUF}, {"init-weights", 1, 0, O_INIT},
        {"init-weights-nonstrict", 0, 0, O_INIT_NS}, {"save-weights", 1, 0, O_SAVE},
        {"checkpoint", 1, 0, O_CKPT}, {"keep", 1, 0, O_KEEP}, {"resume", 1, 0, O_RESUME},
        {"metrics", 1, 0, O_METRICS}, {"eval-only", 0, 0, O_EVAL}, {"predict", 1, 0, O_PREDICT},
        {"limit-batches", 1, 0, O_LIMIT}, {"overfit-batches", 1, 0, O_OVERFIT},
        {"summary", 0, 0, O_SUMMARY}, {"memory-summary", 0, 0, O_MEMSUM},
        {"profile", 0, 0, O_PROFILE}, {"anomaly", 0, 0, O_ANOMALY}, {"dry-run", 0, 0, O_DRY},
        {"list-plugins", 0, 0, O_LIST}, {"help", 0, 0, O_HELP}, {"version", 0, 0, O_VERSION},
        {"warmup-epochs", 1, 0, O_WARMUP}, {"early-stop", 1, 0, O_EARLY},
        {"plugin", 1, 0, O_PLUGIN}, {"quiet", 0, 0, O_QUIET}, {"log-every", 1, 0, O_LOG_EVERY},
        {"metrics-steps", 1, 0, O_METRICS_STEPS}, {"save-best", 1, 0, O_SAVE_BEST},
        {"predict-scores", 1, 0, O_PREDICT_SCORES}, {"eval-batch-size", 1, 0, O_EVAL_BATCH},
        {"tensorboard", 1, 0, O_TENSORBOARD}, {"tensorboard-histograms", 0, 0, O_TB_HIST},
        {"generate", 1, 0, O_GENERATE}, {"prompt", 1, 0, O_PROMPT},
        {"temperature", 1, 0, O_TEMPERATURE}, {"top-k", 1, 0, O_TOP_K},
        {"trace", 1, 0, O_TRACE}, {"plot", 1, 0, O_PLOT},
        {"amp", 1, 0, O_AMP}, {"export-onnx", 1, 0, O_EXPORT_ONNX},
        {"init-onnx", 1, 0, O_INIT_ONNX}, {"ddp-bucket-mib", 1, 0, O_BUCKET},
        {"sync-batchnorm", 0, 0, O_SYNC_BN}, {"graph-capture", 0, 0, O_GRAPH}, {0, 0, 0, 0}};
    const char *plugins[64];
    int n_plugins = 0;
    /* -1: not given on the command line (the config or the default decides). */
    int64_t c_epochs = -1, c_max = -1, c_batch = -1, c_accum = -1, c_workers = -1, c_limit = -1,
            c_overfit = -1, c_seed = -1, c_keep = -1, c_early = -1, c_eval_batch = -1;
    double c_clip = -1;
    const char *c_amp = NULL; /* --amp */
    bool c_graph = false, c_determ = false, c_noshuf = false, c_tb_hist = false, list = false;
    run r;
    memset(&r, 0, sizeof r);
    r.s.epochs = 10;
    r.s.batch_size = 64;
    r.s.accum_steps = 1;
    r.s.shuffle = true;
    r.s.temperature = 1.0;
    bool c_gen_opts = false; /* --prompt, --temperature or --top-k given */
    r.s.keep = EM_CHECKPOINT_KEEP_DEFAULT;
    r.best_metric = NAN;
    r.best_epoch = -1;
    r.best_saved_epoch = -1;
    r.s.log_every_s = 10;
    r.stop = &stop_flag;
    r.d.world = 1; /* a plain run until ddp_start finds a launcher */
    r.d.first_failed = -1;
    r.s.argc = argc;
    r.s.argv = argv;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        bool ok = true;
        int64_t iv; /* the unused half of cli_num's outputs */
        double fv;
        switch (ch) {
        case O_DATA: cli_data = optarg; break;
        case O_DEVICE:
            snprintf(r.s.device, sizeof r.s.device, "%s", optarg);
            r.s.device_given = true;
            break;
        case O_EPOCHS: ok = cli_num(N_EPOCHS, optarg, &c_epochs, &fv); break;
        case O_MAX_STEPS: ok = cli_num(N_MAX_STEPS, optarg, &c_max, &fv); break;
        case O_BATCH: ok = cli_num(N_BATCH, optarg, &c_batch, &fv); break;
        case O_LR: ok = cli_num(N_LR, optarg, &iv, &cli_lr); break;
        case O_OPTIM: cli_optimizer = optarg; break;
        case O_MOMENTUM: ok = cli_num(N_MOMENTUM, optarg, &iv, &cli_momentum); break;
        case O_WD: ok = cli_num(N_WD, optarg, &iv, &cli_wd); break;
        case O_SCHED: cli_scheduler = optarg; break;
        case O_ACCUM: ok = cli_num(N_ACCUM, optarg, &c_accum, &fv); break;
        case O_CLIP: ok = cli_num(N_CLIP, optarg, &iv, &c_clip); break;
        case O_SEED: ok = cli_num(N_SEED, optarg, &c_seed, &fv); break;
        case O_DETERM: c_determ = true; break;
        case O_GRAPH: c_graph = true; break;
        case O_WORKERS: ok = cli_num(N_WORKERS, optarg, &c_workers, &fv); break;
        case O_NOSHUF: c_noshuf = true; break;
        case O_INIT: r.s.init_weights = optarg; break;
        case O_INIT_NS: r.s.init_nonstrict = true; break;
        case O_SAVE: r.s.save_weights = optarg; break;
        case O_EXPORT_ONNX: r.s.export_onnx = optarg; break;
        case O_INIT_ONNX: r.s.init_onnx = optarg; break;
        case O_CKPT: r.s.checkpoint = optarg; break;
        case O_KEEP: ok = cli_num(N_KEEP, optarg, &c_keep, &fv); break;
        case O_WARMUP: ok = cli_num(N_WARMUP, optarg, &cli_warmup, &fv); break;
        case O_EARLY: ok = cli_num(N_EARLY, optarg, &c_early, &fv); break;
        case O_RESUME: r.s.resume = optarg; break;
        case O_METRICS: r.s.metrics = optarg; break;
        case O_METRICS_STEPS: r.s.metrics_steps = optarg; break;
        case O_TENSORBOARD: r.s.tensorboard = optarg; break;
        case O_TB_HIST: c_tb_hist = true; break;
        case O_BUCKET: ok = cli_num(N_BUCKET, optarg, &iv, &r.s.ddp_bucket_mib); break;
        case O_SYNC_BN: r.s.sync_batchnorm = true; break;
        case O_QUIET: r.s.quiet = true; break;
        case O_LOG_EVERY: ok = parse_log_every(&r.s, optarg); break;
        case O_SAVE_BEST: r.s.save_best = optarg; break;
        case O_EVAL_BATCH: ok = cli_num(N_EVAL_BATCH, optarg, &c_eval_batch, &fv); break;
        case O_PREDICT_SCORES:
            if (!strcmp(optarg, "logits")) r.s.predict_scores = PREDICT_LOGITS;
            else if (!strcmp(optarg, "probabilities")) r.s.predict_scores = PREDICT_PROBABILITIES;
            else {
                fprintf(stderr, "ember-train: --predict-scores: '%s' is not logits or "
                        "probabilities\n", optarg);
                ok = false;
            }
            break;
        case O_GENERATE: ok = cli_num(N_GENERATE, optarg, &r.s.generate, &fv); break;
        case O_PROMPT: r.s.prompt = optarg, c_gen_opts = true; break;
        case O_TOP_K: ok = cli_num(N_TOP_K, optarg, &r.s.top_k, &fv), c_gen_opts = true; break;
        case O_TEMPERATURE:
            c_gen_opts = true;
            if (!parse_f64(optarg, &r.s.temperature) || !(r.s.temperature > 0) ||
                !isfinite(r.s.temperature)) {
                fprintf(stderr, "ember-train: --temperature: '%s' is not a finite number > 0 "
                        "(the logits are divided by it; --top-k 1 always takes the most likely "
                        "token)\n", optarg);
                ok = false;
            }
            break;
        case O_AMP:
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp16") && strcmp(optarg, "off")) {
                fprintf(stderr, "ember-train: --amp: '%s' is not bf16, fp16 or off\n", optarg);
                ok = false;
            } else {
                c_amp = optarg;
            }
            break;
        case O_EVAL: r.s.eval_only = true; break;
        case O_PREDICT: r.s.predict = optarg; break;
        case O_LIMIT: ok = cli_num(N_LIMIT, optarg, &c_limit, &fv); break;
        case O_OVERFIT: ok = cli_num(N_OVERFIT, optarg, &c_overfit, &fv); break;
        case O_SUMMARY: r.s.summary = true; break;
        case O_MEMSUM: r.s.memory_summary = true; break;
        case O_PROFILE: r.s.profile = true; break;
        case O_TRACE: r.s.trace = optarg, r.s.profile = true; break;
        case O_PLOT: r.s.plot = optarg; break;
        case O_ANOMALY: r.s.anomaly = true; break;
        case O_DRY: r.s.dry_run = true; break;
        case O_LIST: list = true; break;
        case O_PLUGIN:
            if (n_plugins == (int)(sizeof plugins / sizeof *plugins)) {
                fprintf(stderr, "ember-train: --plugin: at most %zu plugins\n",
                        sizeof plugins / sizeof *plugins);
                return EXIT_USAGE;
            }
            plugins[n_plugins++] = optarg;
            break;
        case O_HELP: usage(stdout); return EXIT_OK;
        case O_VERSION: printf("ember-train %s\n", em_version()); return EXIT_OK;
        case ':':
            fprintf(stderr, "ember-train: %s needs a value (see --help)\n", argv[optind - 1]);
            return EXIT_USAGE;
        default:
            fprintf(stderr, "ember-train: unknown option '%s' (see --help)\n", argv[optind - 1]);
            return EXIT_USAGE;
        }
        if (!ok) return EXIT_USAGE; /* cli_num named the option and its range */
    }
    if (optind < argc) r.s.config_path = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "ember-train: one config file expected, found also '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    if (r.s.init_nonstrict && !r.s.init_weights) {
        fprintf(stderr, "ember-train: --init-weights-nonstrict needs --init-weights\n");
        return EXIT_USAGE;
    }
    if (c_tb_hist && !r.s.tensorboard) {
        fprintf(stderr, "ember-train: --tensorboard-histograms needs --tensorboard DIR\n");
        return EXIT_USAGE;
    }
    if (r.s.predict_scores && !r.s.predict) {
        fprintf(stderr, "ember-train: --predict-scores needs --predict\n");
        return EXIT_USAGE;
    }
    if (r.s.generate && !r.s.init_weights) {
        fprintf(stderr, "ember-train: --generate needs --init-weights (weights saved from a "
                "'text' dataset, which carry its vocabulary)\n");
        return EXIT_USAGE;
    }
    if (r.s.generate && !r.s.prompt) {
        fprintf(stderr, "ember-train: --generate needs --prompt TEXT (at least one character)\n");
        return EXIT_USAGE;
    }
    if (c_gen_opts && !r.s.generate) {
        fprintf(stderr, "ember-train: --prompt, --temperature and --top-k need --generate N\n");
        return EXIT_USAGE;
    }
    if (r.s.generate && (r.s.eval_only || r.s.predict || r.s.dry_run || r.s.resume)) {
        fprintf(stderr, "ember-train: --generate runs alone: not with --eval-only, --predict, "
                "--dry-run or --resume\n");
        return EXIT_USAGE;
    }
    if (r.s.eval_only && !r.s.init_weights && !r.s.init_onnx && !r.s.resume) {
        fprintf(stderr, "ember-train: --eval-only needs --init-weights, --init-onnx or --resume\n");
        return EXIT_USAGE;
    }
    /* Past the file-size limit (ulimit -f) a write fails with EFBIG instead of killing the
     * process, so --metrics and --predict say which file and why (em_save guards itself). */
    signal(SIGXFSZ, SIG_IGN);
    if (r.s.quiet) em_log_set_level(EM_LOG_ERROR); /* the library's warnings, em_init's too */
    if (em_init() != EM_OK) {
        report_error("start-up");
        return EXIT_TRAIN;
    }
    int rc = EXIT_OK;
    /* After em_init, so that a refused plugin is an error with its reason, not a warning. */
    for (int i = 0; i < n_plugins; i++)
        if (em_plugin_load(plugins[i]) != EM_OK) {
            fprintf(stderr, "ember-train: --plugin %s: %s\n", plugins[i], em_last_error());
            rc = EXIT_USAGE;
            goto done;
        }
    if (list) {
        list_plugins();
        goto done;
    }
    if (!r.s.config_path && !(r.s.config_path = default_config())) {
        fprintf(stderr, "ember-train: no CONFIG given and examples/digits.yaml not found (set "
                "EMBER_EXAMPLES_DIR)\n");
        rc = EXIT_USAGE;
        goto done;
    }
    /* under mpirun: join the job; rank 0 speaks for the run */
    if ((rc = ddp_start(&r))) goto done;
    if (!primary(&r)) r.s.quiet = true;
    if ((rc = setup(&r))) goto done;
    /* The command line overrides the loop section. */
    if (c_epochs >= 0) r.s.epochs = c_epochs;
    if (c_max >= 0) r.s.max_steps = c_max;
    if (c_batch >= 0) r.s.batch_size = c_batch;
    if (c_accum >= 0) r.s.accum_steps = c_accum;
    if (c_workers >= 0) r.s.workers = c_workers;
    if (c_limit >= 0) r.s.limit_batches = c_limit;
    if (c_overfit >= 0) r.s.overfit_batches = c_overfit;
    if (c_seed >= 0) r.s.seed = (uint64_t)c_seed;
    if (c_keep >= 0) r.s.keep = c_keep;
    if (c_early >= 0) r.s.early_stop = c_early;
    if (c_clip >= 0) r.s.clip_grad_norm = c_clip;
    if (c_eval_batch >= 0) r.s.eval_batch_size = c_eval_batch;
    if (!r.s.eval_batch_size) r.s.eval_batch_size = r.s.batch_size;
    if (c_determ) r.s.deterministic = true;
    if (c_graph) r.s.graph_capture = true;
    if (c_noshuf) r.s.shuffle = false;
    if (c_tb_hist) r.s.tensorboard_histograms = true;
    if (c_amp) snprintf(r.s.amp, sizeof r.s.amp, "%s", strcmp(c_amp, "off") ? c_amp : "");
    em_grad_scaler_options so = EM_GRAD_SCALER_OPTIONS_INIT;
    if (r.s.amp_init_scale > 0) so.init_scale = r.s.amp_init_scale;
    if (r.s.amp_growth_interval > 0) so.growth_interval = r.s.amp_growth_interval;
    if (!strcmp(r.s.amp, "fp16") && !(r.scaler = em_grad_scaler_new(&so))) {
        report_error("--amp fp16");
        rc = EXIT_USAGE;
        goto done;
    }
    if ((rc = check_ranks_agree(&r, n_plugins))) goto done;
    if (r.d.comm && (r.s.predict || r.s.overfit_batches || r.s.generate)) {
        if (primary(&r))
            fprintf(stderr, "ember-train: %s runs in one process: start it without mpirun\n",
                    r.s.predict    ? "--predict"
                    : r.s.generate ? "--generate"
                                   : "--overfit-batches");
        rc = ddp_agree(&r, EXIT_USAGE);
        goto done;
    }
    /* only rank 0 writes files */
    if ((rc = ddp_agree(&r, primary(&r) ? check_outputs(&r) : 0))) goto done;
    if ((rc = pick_device(&r))) goto done;
    char devname[64];
    say(&r, "ember-train: config %s, device %s", r.s.config_path,
        em_device_str(r.dev, devname, sizeof devname));
    if (r.dev.type == EM_DEVICE_CPU_TYPE) /* the thread count, and why: 64 on a 4-core slot hurts */
        say(&r, " (%d thread%s: %s)", em_num_threads(), em_num_threads() == 1 ? "" : "s",
            em_num_threads_reason());
    say(&r, "\n");
    if (r.d.comm)
        say(&r, "ember-train: data-parallel on %d ranks (%s), %" PRId64 " samples per rank and "
            "step, %" PRId64 " in all\n", r.d.world, em_comm_class_name(r.d.comm),
            r.s.batch_size * r.s.accum_steps, r.s.batch_size * r.s.accum_steps * r.d.world);
    em_seed(r.s.seed);
    em_set_deterministic(r.s.deterministic);
    if (r.s.anomaly) em_set_anomaly(true);
    em_profiler_options popt = {.struct_size = sizeof popt, .trace = r.s.trace != NULL};
    if (r.s.profile && !(r.profiler = em_profiler_begin(&popt))) {
        report_error(r.s.trace ? "--trace" : "--profile");
        rc = EXIT_TRAIN;
        goto done;
    }
    const em_config_node *root = em_config_root(r.cfg);
    const em_config_node *mnode = em_config_node_get(root, "model");
    /* an ONNX model: --init-onnx FILE, or model: {onnx: PATH} (relative to the config) */
    const em_config_node *onode = mnode && em_config_node_kind(mnode) == EM_CONFIG_MAP &&
                                          em_config_node_len(mnode) == 1
                                      ? em_config_node_get(mnode, "onnx") : NULL;
    if (r.s.init_onnx || onode) {
        char full[2 * PATH_MAX + 2];
        const char *p = r.s.init_onnx ? r.s.init_onnx : em_config_node_text(onode);
        if (!p || !*p) {
            fprintf(stderr, "ember-train: %s: model.onnx: expected a file name\n",
                    em_config_node_where(onode));
            rc = EXIT_USAGE;
            goto done;
        }
        if (!r.s.init_onnx && p[0] != '/' && *cfg_dir)
            snprintf(full, sizeof full, "%s/%s", cfg_dir, p);
        else
            snprintf(full, sizeof full, "%s", p);
        /* the config's data.transforms apply: an Ember export's input-transform nodes go */
        em_options *io = em_options_new();
        em_options_set_bool(io, "input_transforms", false);
        r.model = em_onnx_import(full, io);
        em_options_free(io);
        if (!r.model) {
            fprintf(stderr, "ember-train: %s%s: %s\n", r.s.init_onnx ? "--init-onnx " : "",
                    r.s.init_onnx ? full : em_config_node_where(onode), em_last_error());
            rc = EXIT_USAGE;
            goto done;
        }
    } else if (!mnode) {
        fprintf(stderr, "ember-train: %s: no 'model' section\n", r.s.config_path);
        rc = EXIT_USAGE;
        goto done;
    } else if (!(r.model = em_model_build(mnode))) {
        bool missing_class = em_last_status() == EM_ERR_NOTFOUND;
        report_error(NULL);
        if (missing_class)
            fprintf(stderr, "ember-train: a plugin for this run alone: --plugin PATH, or "
                    "'plugins: [PATH]' at the top of the config\n");
        rc = EXIT_USAGE;
        goto done;
    }
    if ((rc = read_data(&r, em_config_node_get(root, "data")))) goto done;
    if (r.d.comm && em_dataset_length(r.train) < r.d.world) {
        /* the same on every rank: the same config and data */
        if (primary(&r))
            fprintf(stderr, "ember-train: %d ranks but the training set holds %" PRId64 " "
                    "sample%s: every rank needs at least one (use at most %" PRId64 " ranks)\n",
                    r.d.world, em_dataset_length(r.train),
                    em_dataset_length(r.train) == 1 ? "" : "s", em_dataset_length(r.train));
        rc = ddp_agree(&r, EXIT_USAGE);
        goto done;
    }
    if (r.d.comm && r.s.sync_batchnorm) {
        /* before the optimizer takes the parameters: the new layers hold new tensors */
        int n = 0;
        if (em_ddp_convert_sync_batchnorm(r.model, &n) != EM_OK) {
            report_error("--sync-batchnorm");
            rc = EXIT_USAGE;
            goto done;
        }
        say(&r, "ember-train: --sync-batchnorm: %d BatchNorm layer%s now SyncBatchNorm\n", n,
            n == 1 ? "" : "s");
    }
    if (r.s.save_best && !r.val && !r.s.overfit_batches) {
        fprintf(stderr, "ember-train: --save-best needs a validation set to find the best epoch: "
                "add data.validation (a fraction, a count, or a map of dataset options) to %s\n",
                r.s.config_path);
        rc = EXIT_USAGE;
        goto done;
    }
    if (r.s.predict_scores && !(r.info->num_classes > 0 && r.info->target_ndim == 0)) {
        fprintf(stderr, "ember-train: --predict-scores needs class targets (the target field "
                "'%s' is not class labels)\n", r.tg_name);
        rc = EXIT_USAGE;
        goto done;
    }
    if (r.s.early_stop && !r.val && !r.s.overfit_batches) {
        fprintf(stderr, "ember-train: --early-stop needs a validation set: add data.validation "
                "(a fraction, a count, or a map of dataset options) to %s\n", r.s.config_path);
        rc = EXIT_USAGE;
        goto done;
    }
    if (em_module_to_device(r.model, r.dev) != EM_OK) {
        report_error("model to device");
        rc = EXIT_TRAIN;
        goto done;
    }
    if (r.s.summary && !primary(&r)) goto done; /* rank 0 prints it */
    if (r.s.summary) {
        int64_t shape[EM_MAX_DIMS + 1] = {1};
        for (int i = 0; i < r.info->input_ndim; i++) shape[i + 1] = r.info->input_shape[i];
        if (em_module_summary(r.model, r.info->input_ndim + 1, shape, stdout) != EM_OK) {
            report_error("summary");
            rc = EXIT_USAGE;
        }
        goto done;
    }
    const em_config_node *lnode = em_config_node_get(root, "loss");
    if (lnode) r.loss = em_model_build(lnode);
    else r.loss = em_module_new(r.info->num_classes > 0 ? "CrossEntropyLoss" : "MSELoss", NULL);
    if (!r.loss) {
        report_error(NULL);
        rc = EXIT_USAGE;
        goto done;
    }
    r.loss_class = em_module_class_of(r.loss)->name;
    if (em_module_class_of(r.loss)->n_inputs != 2) {
        fprintf(stderr, "ember-train: %s: loss: %s is not a loss (it takes %d input%s, a loss "
                "takes the output and the target)\n", em_config_node_where(lnode), r.loss_class,
                em_module_class_of(r.loss)->n_inputs, em_module_class_of(r.loss)->n_inputs == 1 ? "" : "s");
        rc = EXIT_USAGE;
        goto done;
    }
    if ((rc = check_fit(&r))) goto done;
    if ((rc = read_frozen(&r, em_config_node_get(root, "frozen")))) goto done;
    if ((rc = build_optimizer(&r, em_config_node_get(root, "optimizer")))) goto done;
    if ((rc = build_scheduler(&r, em_config_node_get(root, "scheduler")))) goto done;
    if (r.s.init_weights) {
        /* Keys and shapes are checked from the file's header: what the model does not take
         * is never read. */
        em_dict *sd = em_module_state_dict(r.model);
        em_load_report *rep = NULL;
        em_status s = sd ? em_load_into(r.s.init_weights, sd, !r.s.init_nonstrict, &rep, NULL)
                         : em_last_status();
        if (s != EM_OK) {
            fprintf(stderr, "ember-train: --init-weights %s: %s\n", r.s.init_weights, em_last_error());
            rc = EXIT_USAGE;
        } else if (r.s.init_nonstrict) {
            char text[2048];
            em_load_report_format(rep, text, sizeof text);
            fprintf(stderr, "ember-train: --init-weights %s: loaded %zu tensors; %s\n",
                    r.s.init_weights, em_load_report_loaded(rep), text);
        }
        em_load_report_free(rep);
        em_dict_free(sd);
        if (rc) goto done;
    }
    if (r.s.export_onnx && (r.s.init_weights || r.s.init_onnx) && !r.s.resume && c_epochs < 0 && c_max < 0 &&
        !r.s.dry_run && !r.s.eval_only && !r.s.predict) {
        /* --init-weights W --export-onnx F: the loaded model, without training (rank 0's file) */
        rc = ddp_agree(&r, primary(&r) && !write_onnx(&r) ? EXIT_TRAIN : EXIT_OK);
        goto done;
    }
    if (r.s.resume) {
        char why[2048] = "";
        if (checkpoint_load(&r, r.s.resume) != EM_OK) {
            snprintf(why, sizeof why, "%s", em_last_error());
            rc = EXIT_USAGE;
        }
        /* every rank reads the file: the same answer, unless a host cannot read it (then its
         * message is the one to see) */
        bool failed = rc != 0;
        if ((rc = ddp_agree(&r, rc))) {
            if (failed && (primary(&r) || r.d.first_failed != 0))
                fprintf(stderr, "ember-train%s: --resume %s: %s\n",
                        primary(&r) ? "" : " (not rank 0)", r.s.resume, why);
            goto done;
        }
    }
    if (r.s.generate) {
        rc = generate_text(&r);
        goto done;
    }
    if ((rc = ddp_wrap(&r))) goto done;
    if (r.s.dry_run) {
        checkpoint_prepare(&r, true);
        rc = dry_run(&r);
        goto done;
    }
    if (r.s.predict && sequence_targets(&r)) {
        fprintf(stderr, "ember-train: --predict writes one prediction per item; this data has "
                "a class per position (a language model): use --eval-only for its loss and "
                "perplexity, or --generate for its text\n");
        rc = EXIT_USAGE;
        goto done;
    }
    if (r.s.eval_only || r.s.predict) {
        rc = evaluate_only(&r);
        goto done;
    }
    checkpoint_prepare(&r, false);
    if (!signals_start(&r)) {
        rc = EXIT_TRAIN;
        goto done;
    }
    rc = train_loop(&r);
    signals_stop();
done:
    ddp_exit(&r, rc); /* a failure the other ranks do not know of: leave now */
    ddp_free(&r);
    free_run(&r);
    em_shutdown();
    return rc;
}
