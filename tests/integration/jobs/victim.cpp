// A small native library the native-frames tests build with symbols (g++ -g): it crashes the
// ways a custom kernel or extension does, and guards a fault with its own SIGSEGV handler.
#include <pthread.h>
#include <time.h>

#include <csetjmp>
#include <csignal>
#include <stdexcept>

extern "C" {

__attribute__((noinline)) int write_through_null(int value) {
    volatile int* p = nullptr;
    *p = value;   // SIGSEGV
    return 0;
}

__attribute__((noinline)) int divide_by_zero(int x) {
    volatile int zero = 0;
    int q = x / zero;   // SIGFPE on x86; aarch64's division does not trap, so it is raised here
    raise(SIGFPE);
    return q;
}

}  // extern "C"

__attribute__((noinline)) static void thrower(const char* message) {
    throw std::runtime_error(message);
}

extern "C" {

// An exception leaving a noexcept function: std::terminate, then abort()
__attribute__((noinline)) void throw_uncaught(const char* message) noexcept {
    thrower(message);
}

static sigjmp_buf guard_env;

static void on_segv(int) {
    siglongjmp(guard_env, 1);
}

// The program's own SIGSEGV handler, installed before colltrace's: it recovers from the fault.
void install_guard(void) {
    struct sigaction sa = {};
    sa.sa_handler = on_segv;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_NODEFER;
    sigaction(SIGSEGV, &sa, nullptr);
}

// 1 once the guard caught the fault; the program goes on.
int guarded_fault(void) {
    if (sigsetjmp(guard_env, 1))
        return 1;
    write_through_null(7);
    return 0;
}

static pthread_mutex_t the_lock = PTHREAD_MUTEX_INITIALIZER;

// A hang in a C++ lock: takes a lock it already holds, and never returns.
__attribute__((noinline)) void take_lock_twice(void) {
    pthread_mutex_lock(&the_lock);
    pthread_mutex_lock(&the_lock);
}

// The main thread of a loaded machine, as a signal sees it: for `ms` it blocks `sig` (as a thread
// that has another signal pending does), so a signal sent to the process lands on another thread;
// then it takes the signal, and hangs in the lock.
__attribute__((noinline)) void take_lock_twice_after_blocking(int sig, int ms) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, sig);
    pthread_sigmask(SIG_BLOCK, &s, nullptr);
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, nullptr);
    pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
    take_lock_twice();
}

}  // extern "C"
