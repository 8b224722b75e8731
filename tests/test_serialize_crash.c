/*
 * test_serialize_crash.c — em_save's crash safety.
 *
 *   - Fault injection: a forked child saves a new dict over a good file with the test-only
 *     EMBER_TEST_SAVE_KILL hook set, which SIGKILLs it at a chosen byte of the file (130 runs:
 *     every boundary of the layout, then random offsets) or at a step (temporary file created,
 *     all bytes written, fsync'd, renamed). The parent checks the child really died of SIGKILL
 *     (so the kill landed inside the save), that the file then loads and equals the previous
 *     dict exactly (or the new one, once the rename happened), and that the only trace is the
 *     killed writer's temporary file.
 *   - A write that fails half-way (the file-size limit: EFBIG; a full 64 KiB tmpfs: ENOSPC,
 *     where this machine lets a test mount one) and a directory the process may not write to
 *     (EACCES, as an unprivileged user): a clear EM_ERR_IO naming the file and the reason, no
 *     temporary file left, the previous file untouched.
 *   - The previous file's permissions are kept.
 *   - The file-size limit with SIGXFSZ at its default action (which kills): still an error.
 *   - A symbolic link is written through; a FIFO, a device or a directory is refused.
 *   - em_save_check finds an unwritable place before anything is saved; em_save_remove_stale
 *     deletes killed saves' temporary files, and never a live writer's or another host's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "serialize_common.h"

TestSuite(serialize_crash, .init = em_test_setup, .fini = em_test_teardown);

static char g_dir[4096];
static char g_path[4200];

/* A dict of several dtypes; `seed` changes every value, `extra` adds a big tensor. */
static em_dict *make_dict(int seed, int64_t extra) {
    em_dict *d = em_dict_new();
    em_scope_begin();
    float w[64 * 33];
    for (int i = 0; i < 64 * 33; i++) w[i] = (float)(i * 0.25 + seed);
    int64_t steps[17];
    for (int i = 0; i < 17; i++) steps[i] = (int64_t)i * 1000003 * (seed + 1);
    uint16_t h[100];
    for (int i = 0; i < 100; i++) h[i] = (uint16_t)(0x3c00 + i + seed);
    uint8_t m[7];
    for (int i = 0; i < 7; i++) m[i] = (uint8_t)((i + seed) & 1);
    em_dict_set(d, "fc.weight", em_from_data(w, 2, (int64_t[]){64, 33}, EM_F32, em_cpu()));
    em_dict_set(d, "steps", em_from_data(steps, 1, (int64_t[]){17}, EM_I64, em_cpu()));
    em_dict_set(d, "half", em_from_data(h, 1, (int64_t[]){100}, EM_F16, em_cpu()));
    em_dict_set(d, "mask", em_from_data(m, 1, (int64_t[]){7}, EM_BOOL, em_cpu()));
    if (extra)
        em_dict_set(d, "extra", em_full(1, (int64_t[]){extra}, seed, EM_F64, em_cpu()));
    em_scope_end();
    cr_assert_eq(em_dict_len(d), extra ? 5u : 4u, "%s", em_last_error());
    return d;
}

static void remove_temps(const char *dir) {
    DIR *dd = opendir(dir);
    cr_assert(dd);
    struct dirent *de;
    char p[4096 + 512];
    while ((de = readdir(dd)) != NULL)
        if (strstr(de->d_name, ".tmp-")) {
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            cr_assert_eq(unlink(p), 0);
        }
    closedir(dd);
}

/* Fork a child that saves `d` over g_path with EMBER_TEST_SAVE_KILL=`kill`; return its wait
 * status. */
static int killed_save(const em_dict *d, const char *kill) {
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        setenv("EMBER_TEST_SAVE_KILL", kill, 1);
        em_status st = em_save(d, g_path, NULL, NULL);
        _exit(st == EM_OK ? 0 : 3); /* reaching here means the hook never fired */
    }
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    return ws;
}

static void expect_file_equals(const em_dict *want, const char *what) {
    em_dict *got = NULL;
    cr_assert_eq(em_load(g_path, NULL, &got, NULL), EM_OK, "%s: the file does not load: %s",
                 what, em_last_error());
    cr_assert(st_dicts_equal(want, got), "%s: the file does not hold the expected dict", what);
    em_dict_free(got);
}

Test(serialize_crash, killed_saves_leave_the_previous_file) {
    st_mkdtemp(g_dir, sizeof g_dir);
    snprintf(g_path, sizeof g_path, "%s/ckpt.safetensors", g_dir);
    em_dict *a = make_dict(1, 0), *b = make_dict(2, 3000);
    /* The new file's size, and where its header ends. */
    cr_assert_eq(em_save(b, g_path, NULL, NULL), EM_OK, "%s", em_last_error());
    size_t blen;
    unsigned char *bfile = st_read_file(g_path, &blen);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)bfile[i] << (8 * i);
    free(bfile);
    cr_assert_gt(blen, 8 + hlen);
    cr_assert_eq(em_save(a, g_path, NULL, NULL), EM_OK, "%s", em_last_error());

    /* Kill points: the layout's boundaries, then random bytes (a fixed seed: reproducible). */
    uint64_t offsets[130];
    size_t n = 0;
    const uint64_t edges[] = {0, 1, 7, 8, 9, 8 + hlen - 1, 8 + hlen, 8 + hlen + 1, blen - 1};
    for (size_t i = 0; i < ST_ARRAY_LEN(edges); i++) offsets[n++] = edges[i];
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    while (n < ST_ARRAY_LEN(offsets)) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17; /* xorshift64 */
        offsets[n++] = rng % blen;
    }
    for (size_t i = 0; i < n; i++) {
        char kill[32];
        snprintf(kill, sizeof kill, "%llu", (unsigned long long)offsets[i]);
        int ws = killed_save(b, kill);
        cr_assert(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL,
                  "kill at byte %s: the child was not killed inside the save (status %#x)", kill,
                  ws);
        char what[64];
        snprintf(what, sizeof what, "killed at byte %s of %zu", kill, blen);
        expect_file_equals(a, what);
        /* The killed writer's temporary file is the only trace, and holds exactly the bytes
         * written before the kill. */
        cr_assert_eq(st_count_files(g_dir, ".tmp-"), 1, "%s", what);
        DIR *dd = opendir(g_dir);
        struct dirent *de;
        while ((de = readdir(dd)) != NULL)
            if (strstr(de->d_name, ".tmp-")) {
                char p[4096 + 512];
                struct stat sb;
                snprintf(p, sizeof p, "%s/%s", g_dir, de->d_name);
                cr_assert_eq(stat(p, &sb), 0);
                cr_assert_eq((uint64_t)sb.st_size, offsets[i], "%s: temp file has %lld bytes",
                             what, (long long)sb.st_size);
            }
        closedir(dd);
        remove_temps(g_dir);
    }

    /* Steps. Before the rename the previous file stands; after it the new one does. */
    const char *before[] = {"created", "written", "synced"};
    for (size_t i = 0; i < ST_ARRAY_LEN(before); i++) {
        int ws = killed_save(b, before[i]);
        cr_assert(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL, "step %s: not killed", before[i]);
        expect_file_equals(a, before[i]);
        cr_assert_eq(st_count_files(g_dir, ".tmp-"), 1, "step %s", before[i]);
        remove_temps(g_dir);
    }
    int ws = killed_save(b, "renamed");
    cr_assert(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL, "step renamed: not killed");
    expect_file_equals(b, "renamed");
    cr_assert_eq(st_count_files(g_dir, ".tmp-"), 0);

    /* A hook value that names nothing is ignored; and a plain save completes. */
    ws = killed_save(a, "bogus");
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "EMBER_TEST_SAVE_KILL=bogus: %#x", ws);
    expect_file_equals(a, "after a full save");
    cr_assert_eq(st_count_files(g_dir, ".tmp-"), 0);
    em_dict_free(a);
    em_dict_free(b);
    st_rmdir(g_dir);
}

/* ---- failing writes, run in a child that reports through a pipe -------------------------- */

typedef int (*child_fn)(char *msg, size_t cap, void *arg);
#define CHILD_SKIP 77

/* Run fn in a forked child; its message into msg. Returns its exit status (128 + signal when
 * killed). */
static int run_child(child_fn fn, void *arg, char *msg, size_t cap) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(p[0]);
        char m[2048] = "";
        int rc = fn(m, sizeof m, arg);
        ssize_t w = write(p[1], m, strlen(m));
        (void)w;
        _exit(rc);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(p[0], msg + n, cap - 1 - n)) > 0) n += (size_t)r;
    msg[n] = '\0';
    close(p[0]);
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

typedef struct fail_case {
    const char *dir, *path;
    const em_dict *prev, *next;
    const char *reason; /* strerror text expected in the message */
} fail_case;

/* Save next over path (which holds prev), expecting EM_ERR_IO naming the file and the reason,
 * then check the previous file and that no temporary file is left. 0 when all holds. */
static int check_failed_save(char *msg, size_t cap, const fail_case *c) {
    em_status st = em_save(c->next, c->path, NULL, NULL);
    if (st != EM_ERR_IO) {
        snprintf(msg, cap, "save returned %s: %s", em_status_name(st), em_last_error());
        return 1;
    }
    const char *e = em_last_error();
    if (!strstr(e, c->path) || !strstr(e, c->reason) || !strstr(e, "previous file is untouched")) {
        snprintf(msg, cap, "message lacks the file, '%s' or the note: %s", c->reason, e);
        return 1;
    }
    char first[1024];
    snprintf(first, sizeof first, "%s", e);
    em_dict *got = NULL;
    if (em_load(c->path, NULL, &got, NULL) != EM_OK) {
        snprintf(msg, cap, "previous file does not load: %s", em_last_error());
        return 1;
    }
    bool same = st_dicts_equal(c->prev, got);
    em_dict_free(got);
    if (!same) {
        snprintf(msg, cap, "previous file changed");
        return 1;
    }
    DIR *dd = opendir(c->dir);
    struct dirent *de;
    int temps = 0;
    while (dd && (de = readdir(dd)) != NULL) temps += strstr(de->d_name, ".tmp-") != NULL;
    if (dd) closedir(dd);
    if (temps) {
        snprintf(msg, cap, "%d temporary file(s) left", temps);
        return 1;
    }
    snprintf(msg, cap, "%s", first);
    return 0;
}

static int fsize_child(char *msg, size_t cap, void *arg) {
    signal(SIGXFSZ, SIG_IGN); /* then write() fails with EFBIG instead of killing us */
    struct rlimit rl;
    getrlimit(RLIMIT_FSIZE, &rl);
    rl.rlim_cur = 64 * 1024;
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) {
        snprintf(msg, cap, "setrlimit: %s", strerror(errno));
        return 1;
    }
    return check_failed_save(msg, cap, arg);
}

/* The file-size limit stops the write half-way: the same path as a full disk. */
Test(serialize_crash, write_error_keeps_previous_file) {
    st_mkdtemp(g_dir, sizeof g_dir);
    snprintf(g_path, sizeof g_path, "%s/ckpt.safetensors", g_dir);
    em_dict *a = make_dict(1, 0), *b = make_dict(2, 20000); /* b: ~175 KB */
    cr_assert_eq(em_save(a, g_path, NULL, NULL), EM_OK, "%s", em_last_error());
    fail_case c = {g_dir, g_path, a, b, "File too large"};
    char msg[2048];
    int rc = run_child(fsize_child, &c, msg, sizeof msg);
    cr_assert_eq(rc, 0, "%s", msg);
    cr_assert(strstr(msg, "failed after 65536 of"), "%s", msg);
    em_dict_free(a);
    em_dict_free(b);
    st_rmdir(g_dir);
}

static int enospc_child(char *msg, size_t cap, void *arg) {
    fail_case *c = arg;
    /* A private mount namespace, so the tmpfs is invisible outside this child. */
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", c->dir, "tmpfs", 0, "size=64k") != 0) {
        snprintf(msg, cap, "%s", strerror(errno));
        return CHILD_SKIP;
    }
    if (em_save(c->prev, c->path, NULL, NULL) != EM_OK) {
        snprintf(msg, cap, "the small save failed: %s", em_last_error());
        return 1;
    }
    return check_failed_save(msg, cap, c);
}

/* A real full disk: a 64 KiB tmpfs, mounted in a private namespace (root or CAP_SYS_ADMIN). */
Test(serialize_crash, disk_full_keeps_previous_file) {
    st_mkdtemp(g_dir, sizeof g_dir);
    snprintf(g_path, sizeof g_path, "%s/ckpt.safetensors", g_dir);
    em_dict *a = make_dict(1, 0), *b = make_dict(2, 20000);
    fail_case c = {g_dir, g_path, a, b, "No space left on device"};
    char msg[2048];
    int rc = run_child(enospc_child, &c, msg, sizeof msg);
    em_dict_free(a);
    em_dict_free(b);
    st_rmdir(g_dir);
    if (rc == CHILD_SKIP)
        cr_skip_test("cannot mount a 64 KiB tmpfs to fill (%s); the file-size-limit test covers "
                     "the same path", msg);
    cr_assert_eq(rc, 0, "%s", msg);
}

static int eacces_child(char *msg, size_t cap, void *arg) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) {
        snprintf(msg, cap, "cannot drop root privileges: %s", strerror(errno));
        return CHILD_SKIP;
    }
    return check_failed_save(msg, cap, arg);
}

/* A directory the process may not write to: as an unprivileged user (root drops to nobody in
 * the child, since root writes anywhere). */
Test(serialize_crash, permission_denied_keeps_previous_file) {
    st_mkdtemp(g_dir, sizeof g_dir);
    snprintf(g_path, sizeof g_path, "%s/ckpt.safetensors", g_dir);
    em_dict *a = make_dict(1, 0), *b = make_dict(2, 0);
    cr_assert_eq(em_save(a, g_path, NULL, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(chmod(g_dir, 0555), 0);
    fail_case c = {g_dir, g_path, a, b, "Permission denied"};
    char msg[2048];
    int rc = run_child(eacces_child, &c, msg, sizeof msg);
    chmod(g_dir, 0755);
    em_dict_free(a);
    em_dict_free(b);
    st_rmdir(g_dir);
    if (rc == CHILD_SKIP) cr_skip_test("%s", msg);
    cr_assert_eq(rc, 0, "%s", msg);
    cr_assert(strstr(msg, "cannot create a file in"), "%s", msg);
}

Test(serialize_crash, keeps_permissions) {
    st_mkdtemp(g_dir, sizeof g_dir);
    snprintf(g_path, sizeof g_path, "%s/ckpt.safetensors", g_dir);
    em_dict *a = make_dict(1, 0);
    cr_assert_eq(em_save(a, g_path, NULL, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(chmod(g_path, 0600), 0);
    cr_assert_eq(em_save(a, g_path, NULL, NULL), EM_OK, "%s", em_last_error());
    struct stat sb;
    cr_assert_eq(stat(g_path, &sb), 0);
    cr_assert_eq(sb.st_mode & 07777, 0600, "mode %o", sb.st_mode & 07777);
    em_dict_free(a);
    st_rmdir(g_dir);
}

/* ---- issue 13: the file-size limit without ignoring SIGXFSZ, what a save replaces, killed
 * saves' temporary files ---------------------------------------------------------------------- */

static int fsize_default_child(char *msg, size_t cap, void *arg) {
    signal(SIGXFSZ, SIG_DFL); /* a program that never heard of SIGXFSZ: its default kills */
    sigset_t before, after, pending;
    pthread_sigmask(SIG_SETMASK, NULL, &before);
    struct rlimit rl;
    getrlimit(RLIMIT_FSIZE, &rl);
    rl.rlim_cur = 64 * 1024;
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) {
        snprintf(msg, cap, "setrlimit: %s", strerror(errno));
        return 1;
    }
    int rc = check_failed_save(msg, cap, arg);
    pthread_sigmask(SIG_SETMASK, NULL, &after);
    sigpending(&pending);
    if (rc == 0 && (sigismember(&after, SIGXFSZ) != sigismember(&before, SIGXFSZ) ||
                    sigismember(&pending, SIGXFSZ))) {
        snprintf(msg, cap, "the save left SIGXFSZ %s", sigismember(&pending, SIGXFSZ)
                                                             ? "pending" : "blocked");
        return 1;
    }
    return rc;
}

/* Past the file-size limit, with SIGXFSZ at its default action: an error naming the file, not
 * a process killed by the signal (the trainer died of it, exit 153, in the middle of a save). */
Test(serialize_crash, file_size_limit_is_an_error_whatever_the_signal_does) {
    st_mkdtemp(g_dir, sizeof g_dir);
    snprintf(g_path, sizeof g_path, "%s/ckpt.safetensors", g_dir);
    em_dict *a = make_dict(1, 0), *b = make_dict(2, 20000);
    cr_assert_eq(em_save(a, g_path, NULL, NULL), EM_OK, "%s", em_last_error());
    fail_case c = {g_dir, g_path, a, b, "File too large"};
    char msg[2048];
    int rc = run_child(fsize_default_child, &c, msg, sizeof msg);
    cr_assert_eq(rc, 0, "exit %d (%s): %s", rc, rc == 128 + SIGXFSZ ? "killed by SIGXFSZ" : "",
                 msg);
    cr_assert(strstr(msg, "failed after 65536 of"), "%s", msg);
    em_dict_free(a);
    em_dict_free(b);
    st_rmdir(g_dir);
}

/* A path that is a symbolic link is written through to the file it names (the link stays a
 * link), through a chain and when the target does not exist yet; a path that names a FIFO,
 * a device or a directory is refused and left as it is. */
Test(serialize_crash, symlinks_are_written_through_and_special_files_refused) {
    st_mkdtemp(g_dir, sizeof g_dir);
    char real[4300], link1[4300], link2[4300], fifo[4300], dangling[4300], made[4300];
    snprintf(real, sizeof real, "%s/real.safetensors", g_dir);
    snprintf(link1, sizeof link1, "%s/link1.safetensors", g_dir);
    snprintf(link2, sizeof link2, "%s/link2.safetensors", g_dir);
    snprintf(fifo, sizeof fifo, "%s/fifo.safetensors", g_dir);
    snprintf(dangling, sizeof dangling, "%s/dangling.safetensors", g_dir);
    snprintf(made, sizeof made, "%s/made.safetensors", g_dir);
    em_dict *a = make_dict(1, 0), *b = make_dict(2, 0);
    cr_assert_eq(em_save(a, real, NULL, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(symlink("real.safetensors", link1), 0); /* relative to the link's directory */
    cr_assert_eq(symlink(link1, link2), 0);              /* a chain, absolute */
    cr_assert_eq(em_save(b, link2, NULL, NULL), EM_OK, "%s", em_last_error());
    struct stat sb;
    cr_assert(lstat(link1, &sb) == 0 && S_ISLNK(sb.st_mode), "link1 was replaced");
    cr_assert(lstat(link2, &sb) == 0 && S_ISLNK(sb.st_mode), "link2 was replaced");
    snprintf(g_path, sizeof g_path, "%s/real.safetensors", g_dir);
    expect_file_equals(b, "the link's target");
    cr_assert_eq(st_count_files(g_dir, ".tmp-"), 0);
    /* a link to a file that does not exist yet: the file is made, the link kept */
    cr_assert_eq(symlink("made.safetensors", dangling), 0);
    cr_assert_eq(em_save(a, dangling, NULL, NULL), EM_OK, "%s", em_last_error());
    cr_assert(lstat(dangling, &sb) == 0 && S_ISLNK(sb.st_mode));
    snprintf(g_path, sizeof g_path, "%s/made.safetensors", g_dir);
    expect_file_equals(a, "the dangling link's new target");
    /* special files */
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    cr_assert_eq(em_save(a, fifo, NULL, NULL), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "is not a regular file");
    cr_assert(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO was replaced");
    cr_assert_eq(em_save_check(fifo), EM_ERR_INVALID);
    cr_assert_eq(unlink(link1), 0);
    cr_assert_eq(symlink("fifo.safetensors", link1), 0);
    cr_assert_eq(em_save(a, link2, NULL, NULL), EM_ERR_INVALID); /* through the links */
    cr_assert(strstr(em_last_error(), "a symbolic link to") && strstr(em_last_error(), fifo),
              "%s", em_last_error());
    cr_assert_eq(em_save(a, "/dev/null", NULL, NULL), EM_ERR_INVALID);
    cr_assert_eq(em_save(a, g_dir, NULL, NULL), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "is a directory");
    cr_assert_eq(st_count_files(g_dir, ".tmp-"), 0);
    em_dict_free(a);
    em_dict_free(b);
    st_rmdir(g_dir);
}

/* em_save_check finds what the first save would: a missing directory, a path through a file. */
Test(serialize_crash, save_check_finds_an_unwritable_place_before_anything_is_saved) {
    st_mkdtemp(g_dir, sizeof g_dir);
    char p[4300], file[4300];
    snprintf(p, sizeof p, "%s/ok.safetensors", g_dir);
    cr_assert_eq(em_save_check(p), EM_OK, "%s", em_last_error());
    cr_assert_eq(st_count_files(g_dir, ""), 0, "the check left a file");
    snprintf(p, sizeof p, "%s/missing/ck.safetensors", g_dir);
    cr_assert_eq(em_save_check(p), EM_ERR_IO);
    cr_assert(strstr(em_last_error(), "missing'") &&
              strstr(em_last_error(), "the directory does not exist"), "%s", em_last_error());
    snprintf(file, sizeof file, "%s/plain", g_dir);
    st_write_file(file, "x", 1);
    snprintf(p, sizeof p, "%s/plain/ck.safetensors", g_dir);
    cr_assert_eq(em_save_check(p), EM_ERR_IO);
    em_assert_error(EM_ERR_IO, "Not a directory");
    cr_assert_eq(em_save_check(g_dir), EM_ERR_INVALID);
    cr_assert_eq(em_save_check(""), EM_ERR_INVALID);
    st_rmdir(g_dir);
}

/* A killed save leaves ".NAME.tmp-HOST-PID-N"; em_save_remove_stale deletes it once its writer
 * is gone, and never a live process's file, another host's, another name's or an older
 * scheme's. */
Test(serialize_crash, temporary_files_of_killed_saves_are_removed) {
    st_mkdtemp(g_dir, sizeof g_dir);
    snprintf(g_path, sizeof g_path, "%s/ck-12.safetensors", g_dir);
    em_dict *a = make_dict(1, 0);
    cr_assert_eq(em_save(a, g_path, NULL, NULL), EM_OK, "%s", em_last_error());
    int ws = killed_save(a, "written");
    cr_assert(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
    DIR *dd = opendir(g_dir);
    struct dirent *de;
    char dead[256] = "";
    while ((de = readdir(dd)) != NULL)
        if (strstr(de->d_name, ".tmp-")) snprintf(dead, sizeof dead, "%.200s", de->d_name);
    closedir(dd);
    /* ".ck-12.safetensors.tmp-" HOST "-" PID "-" N */
    const char *pre = ".ck-12.safetensors.tmp-";
    cr_assert(!strncmp(dead, pre, strlen(pre)), "temporary name '%s'", dead);
    char host[256];
    snprintf(host, sizeof host, "%.200s", dead + strlen(pre));
    *strrchr(host, '-') = '\0';
    *strrchr(host, '-') = '\0'; /* HOST */
    cr_assert(host[0] && !strchr(host, '.'), "'%s'", dead);
    /* bystanders: a live writer (this process), another host, another pattern, the old scheme */
    const char *keep_fmt[] = {".ck-12.safetensors.tmp-%s-%ld-7", ".ck-12.safetensors.tmp-other%s-1-0",
                              ".other-3.safetensors.tmp-%s-1-0", ".ck-12.safetensors.tmp-1-2"};
    char p[4096 + 1024], name[512];
    for (size_t i = 0; i < ST_ARRAY_LEN(keep_fmt); i++) {
        snprintf(name, sizeof name, keep_fmt[i], host, (long)getpid());
        snprintf(p, sizeof p, "%s/%s", g_dir, name);
        st_write_file(p, "x", 1);
    }
    /* the pattern form: any step's killed save */
    snprintf(name, sizeof name, ".ck-99.safetensors.tmp-%s-1-0", host); /* pid 1 lives */
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    st_write_file(p, "x", 1);
    size_t removed = 99;
    cr_assert_eq(em_save_remove_stale(g_path, &removed), EM_OK, "%s", em_last_error());
    cr_assert_eq(removed, 1u);
    snprintf(p, sizeof p, "%s/%s", g_dir, dead);
    cr_assert_neq(access(p, F_OK), 0, "%s survived", dead);
    cr_assert_eq(st_count_files(g_dir, ".tmp-"), 5);
    /* a second killed save, found by the pattern */
    ws = killed_save(a, "created");
    cr_assert(WIFSIGNALED(ws));
    char pattern[4300];
    snprintf(pattern, sizeof pattern, "%s/ck-{step}.safetensors", g_dir);
    cr_assert_eq(em_save_remove_stale(pattern, &removed), EM_OK, "%s", em_last_error());
    cr_assert_eq(removed, 1u);
    cr_assert_eq(st_count_files(g_dir, ".tmp-"), 5);
    snprintf(pattern, sizeof pattern, "%s/none/ck-{step}.safetensors", g_dir);
    cr_assert_eq(em_save_remove_stale(pattern, &removed), EM_OK); /* no directory: nothing */
    em_dict_free(a);
    st_rmdir(g_dir);
}
