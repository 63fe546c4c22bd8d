// The uncaught C++ exception behind an abort (part of colltrace/rank/_crash.c's module, built where
// a C++ compiler is found). std::terminate runs this handler on the thread that threw, in ordinary
// context (not a signal handler), before the previous handler (libstdc++'s verbose one prints
// "terminate called after throwing ..." and calls abort(), whose SIGABRT _crash.c then reports).
// It writes the exception's type (mangled; the reader demangles it) and what() to the rank's
// rank-N.native.txt, then chains: what the process prints and how it ends are unchanged.
#include <cstdlib>
#include <cxxabi.h>
#include <exception>
#include <typeinfo>
#include <unistd.h>

namespace {

int out_fd = -1;
pid_t owner = 0;   // a forked child inherits the handler: it writes nothing
std::terminate_handler previous = nullptr;

void put(const char* s, size_t n) {
    while (n > 0) {
        ssize_t w = ::write(out_fd, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= static_cast<size_t>(w);
    }
}

void put(const char* s) {
    size_t n = 0;
    while (s[n])
        n++;
    put(s, n);
}

// One line: a newline or backslash in the message is escaped, the rest is the message's bytes.
void put_escaped(const char* s, size_t cap) {
    char buf[512];
    size_t k = 0;
    for (size_t i = 0; s[i] && i < cap; i++) {
        if (k + 2 > sizeof(buf)) {
            put(buf, k);
            k = 0;
        }
        char c = s[i];
        if (c == '\n') {
            buf[k++] = '\\';
            buf[k++] = 'n';
        } else if (c == '\\') {
            buf[k++] = '\\';
            buf[k++] = '\\';
        } else if (c == '\r') {
            buf[k++] = ' ';
        } else {
            buf[k++] = c;
        }
    }
    put(buf, k);
}

void on_terminate() {
    static bool once = false;
    if (!once && out_fd >= 0 && ::getpid() == owner) {
        once = true;
        std::type_info* t = abi::__cxa_current_exception_type();
        if (t != nullptr) {
            char pid[24];
            int n = 0;
            for (pid_t v = owner; v > 0 && n < 20; v /= 10)
                pid[n++] = static_cast<char>('0' + v % 10);
            put("exception pid=");
            while (n > 0)
                put(&pid[--n], 1);
            put(" type=");
            put_escaped(t->name(), 1024);
            put("\n");
            try {
                throw;   // the current exception, to read what() when it is a std::exception
            } catch (const std::exception& e) {
                const char* what = nullptr;
                try {
                    what = e.what();
                } catch (...) {
                }
                if (what != nullptr) {
                    put("what ");
                    put_escaped(what, 4000);
                    put("\n");
                }
            } catch (...) {
            }
        }
    }
    if (previous != nullptr)
        previous();
    std::abort();
}

}  // namespace

extern "C" int colltrace_terminate_install(int fd) {
    out_fd = fd;
    owner = ::getpid();
    std::terminate_handler now = std::get_terminate();
    if (now != on_terminate) {
        previous = now;
        std::set_terminate(on_terminate);
    }
    return 1;
}
