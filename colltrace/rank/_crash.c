/* A rank's native frames at the moment it dies of a fatal signal, and on request while it lives
 * (optional; colltrace/rank/crash.py loads it, built at install by hatch_build.py).
 *
 * The fatal-signal handler runs inside the dying process, so it does only what is
 * async-signal-safe: backtrace() (warmed up at install, so libgcc's unwinder is already loaded and
 * it allocates nothing), clock_gettime, getpid, gettid, and read/write on file descriptors opened
 * at install (the rank's rank-N.native.txt and its own /proc/self/maps, read again from offset 0).
 * It writes raw addresses with the object each falls in and the offset in that object's file (from
 * the maps, with the file's device and inode, so that a reader can tell it has the same file);
 * symbols are resolved afterwards, outside the dying process, from the objects' own symbol tables
 * (colltrace/tracefile/native.py). Then the previous handler runs as it would have: faulthandler's,
 * torch's, the program's, or the default action (the signal is delivered again with its default
 * disposition), so the exit status, the signal and any core dump are what they were untraced.
 *
 * The same handler on colltrace's stack signal (faulthandler's, SIGRTMIN+7) writes the main
 * thread's frames for the watchdog beside faulthandler's dump (taken by the main thread itself,
 * wherever the kernel delivered the watchdog's signal), and answers the rank's own poller thread
 * (main_stack) with the main thread's frames without faulthandler.
 *
 * The uncaught C++ exception behind an abort is written by the terminate handler in
 * _terminate.cpp, where a C++ compiler built it.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define MAX_FRAMES 64
#define PATH_CAP 512
#define LINE_CAP 4096

static int crash_fd = -1;       /* rank-N.native.txt */
static int stack_fd = -1;       /* rank-N.native-stack.txt: the watchdog's signal */
static int maps_fd = -1;        /* /proc/self/maps, opened at install */
static pid_t owner;             /* a forked child inherits the handler: it writes nothing */
static int stack_sig = 0;

static struct sigaction prev_action[NSIG];
static char handled[NSIG];
static int busy;   /* one report at a time (taken atomically), and none from inside itself */

static void *frames[MAX_FRAMES + 16];
static uintptr_t frame_off[MAX_FRAMES + 16];
static char frame_dev[MAX_FRAMES + 16][16];
static unsigned long long frame_ino[MAX_FRAMES + 16];
static char frame_path[MAX_FRAMES + 16][PATH_CAP];
static char mapped[MAX_FRAMES + 16];

/* the rank's own poller asks for the main thread's frames (main_stack) */
static volatile sig_atomic_t live_asked, live_done;
/* the watchdog's signal to the process landed on another thread: the main thread writes its frames */
static int forward_asked;
static void *live_frames[MAX_FRAMES + 16];
static volatile int live_count;

#ifndef COLLTRACE_NO_CXX
extern int colltrace_terminate_install(int fd);
#endif

/* ---- async-signal-safe output --------------------------------------------------------------- */
typedef struct {
    char buf[LINE_CAP];
    size_t n;
    int fd;
} Out;

static void out_flush(Out *o)
{
    size_t done = 0;
    while (done < o->n) {
        ssize_t w = write(o->fd, o->buf + done, o->n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    o->n = 0;
}

static void out_str(Out *o, const char *s)
{
    while (*s) {
        if (o->n == sizeof(o->buf))
            out_flush(o);
        o->buf[o->n++] = *s++;
    }
}

static void out_hex(Out *o, uintptr_t v)
{
    char tmp[24];
    int i = 0;
    do {
        tmp[i++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    out_str(o, "0x");
    while (i)
        out_str(o, (char[]){tmp[--i], 0});
}

static void out_dec(Out *o, long long v)
{
    char tmp[24];
    int i = 0;
    unsigned long long u = v < 0 ? (unsigned long long)(-v) : (unsigned long long)v;
    if (v < 0)
        out_str(o, "-");
    do {
        tmp[i++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    while (i)
        out_str(o, (char[]){tmp[--i], 0});
}

/* ---- where each address is: /proc/self/maps, read without allocating -------------------------- */
static uintptr_t parse_hex(const char **p)
{
    uintptr_t v = 0;
    for (;; (*p)++) {
        char c = **p;
        if (c >= '0' && c <= '9')
            v = v * 16 + (uintptr_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v = v * 16 + (uintptr_t)(c - 'a' + 10);
        else
            return v;
    }
}

static void map_line(const char *line, void **addrs, int n)
{
    const char *p = line;
    uintptr_t start = parse_hex(&p);
    if (*p++ != '-')
        return;
    uintptr_t end = parse_hex(&p);
    int hit = 0;
    for (int i = 0; i < n; i++)
        if (!mapped[i] && (uintptr_t)addrs[i] >= start && (uintptr_t)addrs[i] < end)
            hit = 1;
    if (!hit)
        return;
    while (*p == ' ')
        p++;
    while (*p && *p != ' ')   /* permissions */
        p++;
    while (*p == ' ')
        p++;
    uintptr_t offset = parse_hex(&p);
    while (*p == ' ')
        p++;
    const char *dev = p;
    while (*p && *p != ' ')
        p++;
    size_t devlen = (size_t)(p - dev);
    while (*p == ' ')
        p++;
    unsigned long long ino = 0;
    while (*p >= '0' && *p <= '9')
        ino = ino * 10 + (unsigned long long)(*p++ - '0');
    while (*p == ' ')
        p++;
    for (int i = 0; i < n; i++) {
        if (mapped[i] || (uintptr_t)addrs[i] < start || (uintptr_t)addrs[i] >= end)
            continue;
        mapped[i] = 1;
        frame_off[i] = (uintptr_t)addrs[i] - start + offset;
        size_t k = devlen < sizeof(frame_dev[i]) - 1 ? devlen : sizeof(frame_dev[i]) - 1;
        memcpy(frame_dev[i], dev, k);
        frame_dev[i][k] = 0;
        frame_ino[i] = ino;
        size_t j = 0;
        while (p[j] && p[j] != '\n' && j < PATH_CAP - 1) {
            frame_path[i][j] = p[j];
            j++;
        }
        frame_path[i][j] = 0;
    }
}

static void locate(void **addrs, int n)
{
    static char buf[LINE_CAP * 2];
    for (int i = 0; i < n; i++)
        mapped[i] = 0;
    if (maps_fd < 0 || lseek(maps_fd, 0, SEEK_SET) != 0)
        return;
    size_t have = 0;
    for (;;) {
        ssize_t r = read(maps_fd, buf + have, sizeof(buf) - 1 - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        have += (size_t)r;
        buf[have] = 0;
        char *line = buf;
        char *nl;
        while ((nl = memchr(line, '\n', have - (size_t)(line - buf))) != NULL) {
            *nl = 0;
            map_line(line, addrs, n);
            line = nl + 1;
        }
        have -= (size_t)(line - buf);
        if (have == sizeof(buf) - 1)   /* one line longer than the buffer: drop it */
            have = 0;
        memmove(buf, line, have);
    }
    if (have) {
        buf[have] = 0;
        map_line(buf, addrs, n);
    }
}

/* ---- the frames of the interrupted code -------------------------------------------------------- */
static uintptr_t interrupted_pc(void *uc)
{
    if (uc == NULL)
        return 0;
    const ucontext_t *u = (const ucontext_t *)uc;
#if defined(__x86_64__)
    return (uintptr_t)u->uc_mcontext.gregs[REG_RIP];
#elif defined(__i386__)
    return (uintptr_t)u->uc_mcontext.gregs[REG_EIP];
#elif defined(__aarch64__)
    return (uintptr_t)u->uc_mcontext.pc;
#elif defined(__powerpc64__)
    return (uintptr_t)u->uc_mcontext.gp_regs[32];
#else
    (void)u;
    return 0;
#endif
}

/* backtrace() into `out`, the frames of this handler and of the kernel's signal trampoline
 * dropped: the interrupted code's own frame (its exact pc) comes first. Returns how many. */
static int take_frames(void **out, void *uc)
{
    void *raw[MAX_FRAMES + 16];
    int n = backtrace(raw, MAX_FRAMES + 16);
    uintptr_t pc = interrupted_pc(uc);
    int first = -1;
    for (int i = 0; i < n && pc; i++)
        if ((uintptr_t)raw[i] == pc) {
            first = i;
            break;
        }
    int k = 0;
    if (first < 0) {   /* the unwinder did not pass the trampoline: the pc alone, then what it has */
        if (pc)
            out[k++] = (void *)pc;
        return k;
    }
    for (int i = first; i < n && k < MAX_FRAMES; i++)
        out[k++] = raw[i];
    return k;
}

static void write_frames(Out *o, void **addrs, int n)
{
    locate(addrs, n);
    for (int i = 0; i < n; i++) {
        out_str(o, "f ");
        out_hex(o, (uintptr_t)addrs[i]);
        out_str(o, i == 0 ? " p " : " r ");   /* p: the pc itself; r: a return address */
        if (!mapped[i]) {
            out_str(o, "? ? ? ?\n");
            continue;
        }
        out_hex(o, frame_off[i]);
        out_str(o, " ");
        out_str(o, frame_dev[i][0] ? frame_dev[i] : "?");
        out_str(o, " ");
        out_dec(o, (long long)frame_ino[i]);
        out_str(o, " ");
        out_str(o, frame_path[i][0] ? frame_path[i] : "?");
        out_str(o, "\n");
    }
}

static void write_header(Out *o, const char *what, int sig, siginfo_t *info)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    out_str(o, "begin ");
    out_str(o, what);
    out_str(o, " sig=");
    out_dec(o, sig);
    if (info != NULL) {
        out_str(o, " code=");
        out_dec(o, info->si_code);
        out_str(o, " addr=");
        out_hex(o, (uintptr_t)info->si_addr);
        out_str(o, " from=");
        out_dec(o, info->si_code <= 0 ? (long long)info->si_pid : 0);
    }
    out_str(o, " pid=");
    out_dec(o, getpid());
    out_str(o, " tid=");
    out_dec(o, (long long)syscall(SYS_gettid));
    out_str(o, " thread=");   /* pthread_self(), as faulthandler names threads */
    out_hex(o, (uintptr_t)pthread_self());
    out_str(o, " t=");
    out_dec(o, (long long)ts.tv_sec);
    out_str(o, ".");
    char us[7];
    long v = ts.tv_nsec / 1000;
    for (int i = 5; i >= 0; i--, v /= 10)
        us[i] = (char)('0' + v % 10);
    us[6] = 0;
    out_str(o, us);
    out_str(o, "\n");
}

static void write_report(int fd, const char *what, int sig, siginfo_t *info, void *uc)
{
    static Out o;
    o.fd = fd;
    o.n = 0;
    write_header(&o, what, sig, info);
    out_flush(&o);   /* the header first: if the unwinder faults, the signal is still said */
    int n = take_frames(frames, uc);
    write_frames(&o, frames, n);
    out_str(&o, "end\n");
    out_flush(&o);
}

/* ---- chaining -------------------------------------------------------------------------------- */
static void self_install(int sig);

/* Run what would have run without colltrace's handler. Returns 0 if that handler returned (the
 * process goes on), 1 if the default action was restored for the signal to come again. */
static int chain(int sig, siginfo_t *info, void *uc)
{
    struct sigaction *p = &prev_action[sig];
    if ((p->sa_flags & SA_SIGINFO) && p->sa_sigaction != NULL) {
        p->sa_sigaction(sig, info, uc);
        return 0;
    }
    if (!(p->sa_flags & SA_SIGINFO) && p->sa_handler == SIG_IGN)
        return 0;
    if (!(p->sa_flags & SA_SIGINFO) && p->sa_handler != SIG_DFL) {
        p->sa_handler(sig);
        return 0;
    }
    /* The default action: restore it, and let the signal come again. A fault the kernel raised
     * (si_code > 0) recurs when the faulting instruction runs again on return, with the same
     * context (and core); a signal sent by a process is sent again to this thread. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    if (info == NULL || info->si_code <= 0 || sig == SIGABRT)
        raise(sig);
    return 1;
}

static void on_fatal(int sig, siginfo_t *info, void *uc)
{
    int saved = errno;
    int mine = 0;
    /* busy covers the report only, not the chain: a handler down the chain may leave by
     * siglongjmp and never come back here */
    if (crash_fd >= 0 && getpid() == owner && !__atomic_exchange_n(&busy, 1, __ATOMIC_SEQ_CST)) {
        mine = 1;
        write_report(crash_fd, "crash", sig, info, uc);
        __atomic_store_n(&busy, 0, __ATOMIC_SEQ_CST);
    }
    if (chain(sig, info, uc)) {
        errno = saved;
        return;   /* the fault recurs under the default action */
    }
    /* Still here: the previous handler (the program's own) let the process go on. Say so, and be
     * the first handler again (faulthandler put its predecessor back before calling it). */
    if (mine) {
        static Out o;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        o.fd = crash_fd;
        o.n = 0;
        out_str(&o, "returned t=");
        out_dec(&o, (long long)ts.tv_sec);
        out_str(&o, "\n");
        out_flush(&o);
    }
    self_install(sig);
    errno = saved;
}

static void on_stack_signal(int sig, siginfo_t *info, void *uc)
{
    int saved = errno;
    int on_main = (pid_t)syscall(SYS_gettid) == owner;
    if (on_main && info != NULL && info->si_code == SI_TKILL && info->si_pid == getpid()) {
        /* real-time signals queue: each question is answered by the first delivery after it, and
         * a question its asker gave up on (main_stack's timeout) writes nothing */
        if (live_asked != live_done) {
            /* the rank's own poller asks (main_stack): the frames into memory, no faulthandler dump */
            live_count = take_frames(live_frames, uc);
            live_done = live_asked;
        }
        if (__atomic_exchange_n(&forward_asked, 0, __ATOMIC_SEQ_CST) && stack_fd >= 0
            && !__atomic_exchange_n(&busy, 1, __ATOMIC_SEQ_CST)) {
            /* forwarded below: the watchdog's question, faulthandler already answered it */
            write_report(stack_fd, "stack", sig, info, uc);
            __atomic_store_n(&busy, 0, __ATOMIC_SEQ_CST);
        }
        errno = saved;
        return;
    }
    if (!on_main && stack_fd >= 0 && getpid() == owner) {
        /* A signal sent to the process goes to any thread that does not block it, and the kernel
         * passes over the main thread while it has another signal pending (a loaded machine that
         * has not run it yet): the native frames asked for are the main thread's, so it is asked
         * for them directly; faulthandler, chained from here, still dumps every thread's. */
        __atomic_store_n(&forward_asked, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_tgkill, owner, owner, sig);
    } else if (stack_fd >= 0 && getpid() == owner && !__atomic_exchange_n(&busy, 1, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&forward_asked, 0, __ATOMIC_SEQ_CST);
        write_report(stack_fd, "stack", sig, info, uc);
        __atomic_store_n(&busy, 0, __ATOMIC_SEQ_CST);
    }
    (void)chain(sig, info, uc);
    errno = saved;
}

static int set_handler(int sig, void (*fn)(int, siginfo_t *, void *), int flags, struct sigaction *old)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = fn;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | flags;
    return sigaction(sig, &sa, old);
}

static void self_install(int sig)
{
    struct sigaction now;
    if (sigaction(sig, NULL, &now) != 0 || (now.sa_flags & SA_SIGINFO && now.sa_sigaction == on_fatal))
        return;
    /* SA_NODEFER, as faulthandler: a handler down the chain that raises the signal again (to die
     * of it) must see it delivered at once, not after this handler returns. */
    set_handler(sig, on_fatal, SA_NODEFER, &prev_action[sig]);
}

/* ---- Python ---------------------------------------------------------------------------------- */
static PyObject *py_install(PyObject *self, PyObject *args)
{
    int fd, mfd;
    PyObject *sigs;
    if (!PyArg_ParseTuple(args, "iiO!", &fd, &mfd, &PyTuple_Type, &sigs))
        return NULL;
    /* Warm backtrace() up: its first call loads libgcc's unwinder (dlopen, malloc), which must
     * never happen inside a signal handler. */
    void *warm[4];
    if (backtrace(warm, 4) <= 0) {
        PyErr_SetString(PyExc_OSError, "backtrace() returned no frames");
        return NULL;
    }
    crash_fd = fd;
    maps_fd = mfd;
    owner = getpid();
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sigs); i++) {
        long sig = PyLong_AsLong(PyTuple_GET_ITEM(sigs, i));
        if (sig <= 0 || sig >= NSIG) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "bad signal %ld", sig);
            return NULL;
        }
        handled[sig] = 1;
        self_install((int)sig);
    }
    Py_RETURN_NONE;
}

static PyObject *py_install_stack(PyObject *self, PyObject *args)
{
    int sig, fd;
    if (!PyArg_ParseTuple(args, "ii", &sig, &fd))
        return NULL;
    if (sig <= 0 || sig >= NSIG || maps_fd < 0) {
        PyErr_SetString(PyExc_ValueError, "install() first, with a valid signal");
        return NULL;
    }
    stack_fd = fd;
    stack_sig = sig;
    /* SA_RESTART, as faulthandler's registration without chain: a system call the signal
     * interrupts is resumed. */
    if (set_handler(sig, on_stack_signal, SA_RESTART, &prev_action[sig]) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *py_main_stack(PyObject *self, PyObject *args)
{
    unsigned long long ident;
    double timeout;
    if (!PyArg_ParseTuple(args, "Kd", &ident, &timeout))
        return NULL;
    if (!stack_sig)
        Py_RETURN_NONE;
    sig_atomic_t ask = live_asked + 1;
    live_asked = ask;
    int err = pthread_kill((pthread_t)ident, stack_sig);
    if (err != 0) {
        live_done = ask;
        Py_RETURN_NONE;
    }
    int got = 0;
    Py_BEGIN_ALLOW_THREADS
    struct timespec nap = {0, 500000}, t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (live_done == ask) {
            got = 1;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9 >= timeout)
            break;
        nanosleep(&nap, NULL);
    }
    Py_END_ALLOW_THREADS
    if (!got) {
        live_done = ask;   /* a late delivery then writes nothing for this question */
        Py_RETURN_NONE;
    }
    int n = live_count;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *v = PyLong_FromVoidPtr(live_frames[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *py_terminate(PyObject *self, PyObject *args)
{
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd))
        return NULL;
#ifdef COLLTRACE_NO_CXX
    Py_RETURN_FALSE;
#else
    return PyBool_FromLong(colltrace_terminate_install(fd));
#endif
}

static PyObject *py_disposition(PyObject *self, PyObject *args)
{
    int sig;
    struct sigaction now;
    if (!PyArg_ParseTuple(args, "i", &sig))
        return NULL;
    if (sig <= 0 || sig >= NSIG || sigaction(sig, NULL, &now) != 0) {
        PyErr_SetString(PyExc_ValueError, "bad signal");
        return NULL;
    }
    if (!(now.sa_flags & SA_SIGINFO) && now.sa_handler == SIG_DFL)
        return PyLong_FromLong(0);
    if (!(now.sa_flags & SA_SIGINFO) && now.sa_handler == SIG_IGN)
        return PyLong_FromLong(1);
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_fatal)
        return PyLong_FromLong(3);
    return PyLong_FromLong(2);
}

static PyObject *py_lock_free_unwind(PyObject *self, PyObject *noargs)
{
    /* glibc >= 2.35's _dl_find_object: libgcc's unwinder finds a pc's unwind tables without the
     * loader's lock, so interrupting a thread that holds that lock cannot deadlock the unwind. */
    return PyBool_FromLong(dlsym(RTLD_DEFAULT, "_dl_find_object") != NULL);
}

static PyMethodDef methods[] = {
    {"install", py_install, METH_VARARGS,
     "install(fd, maps_fd, signals): write the native frames of a fatal signal to fd, then chain"},
    {"install_stack", py_install_stack, METH_VARARGS,
     "install_stack(signal, fd): on colltrace's stack signal, the interrupted thread's frames to fd, then chain"},
    {"main_stack", py_main_stack, METH_VARARGS,
     "main_stack(thread_ident, timeout_s): that thread's native frames (addresses, innermost first) or None"},
    {"install_terminate", py_terminate, METH_VARARGS,
     "install_terminate(fd): write an uncaught C++ exception's type and what() to fd, then chain"},
    {"disposition", py_disposition, METH_VARARGS, "disposition(signal): 0 default, 1 ignored, 2 a handler, 3 colltrace's own"},
    {"lock_free_unwind", py_lock_free_unwind, METH_NOARGS, "whether unwinding takes no loader lock"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_crash", "colltrace's native frames at a crash.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__crash(void)
{
    return PyModule_Create(&module);
}
