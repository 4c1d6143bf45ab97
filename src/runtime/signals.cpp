#include "runtime/signals.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <ctime>

#include "util/errors.h"

namespace sqbox {

namespace {
constexpr std::array kForwardedSignals{SIGINT, SIGTERM, SIGHUP, SIGQUIT};
}  // namespace

bool is_forwarded_signal(int sig) {
    return std::find(kForwardedSignals.begin(), kForwardedSignals.end(), sig) !=
           kForwardedSignals.end();
}

sigset_t forwarded_signals() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : kForwardedSignals) sigaddset(&set, sig);
    return set;
}

sigset_t pipeline_signals() {
    sigset_t set = forwarded_signals();
    sigaddset(&set, SIGCHLD);
    return set;
}

ScopedSignalBlock::ScopedSignalBlock() {
    sigset_t set = pipeline_signals();
    if (::sigprocmask(SIG_BLOCK, &set, &previous_) != 0) throw system_error("sigprocmask");
}

ScopedSignalBlock::~ScopedSignalBlock() {
    (void)::sigprocmask(SIG_SETMASK, &previous_, nullptr);
}

std::optional<int> pending_forwarded_signal() noexcept {
    sigset_t pending;
    // sigpending fails only for a bad pointer.
    if (::sigpending(&pending) != 0) return std::nullopt;
    for (int sig : kForwardedSignals) {
        if (sigismember(&pending, sig) == 1) return sig;
    }
    return std::nullopt;
}

std::optional<siginfo_t> wait_for_signal(std::optional<long> timeout_ms, int also) {
    sigset_t set = pipeline_signals();
    if (also != 0) sigaddset(&set, also);
    siginfo_t info{};
    for (;;) {
        int sig;
        if (timeout_ms) {
            long ms = *timeout_ms < 0 ? 0 : *timeout_ms;
            timespec timeout{ms / 1000, (ms % 1000) * 1000000L};
            sig = ::sigtimedwait(&set, &info, &timeout);
        } else {
            sig = ::sigwaitinfo(&set, &info);
        }
        if (sig > 0) return info;
        if (errno == EAGAIN) return std::nullopt;
        if (errno != EINTR) throw system_error("waiting for signals");
    }
}

void ignore_forwarded_signals() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    // Setting SIG_IGN also drops a pending one, blocked or not (POSIX, sigaction). It cannot fail
    // for these signals (EINVAL is for SIGKILL, SIGSTOP and numbers out of range).
    for (int sig : kForwardedSignals) (void)::sigaction(sig, &ignore, nullptr);
}

void reset_signal_handling() {
    struct sigaction action {};
    action.sa_handler = SIG_DFL;
    sigemptyset(&action.sa_mask);
    for (int sig = 1; sig < NSIG; ++sig) {
        if (sig == SIGKILL || sig == SIGSTOP) continue;
        (void)::sigaction(sig, &action, nullptr);  // EINVAL for the few unsettable ones
    }
    sigset_t none;
    sigemptyset(&none);
    if (::sigprocmask(SIG_SETMASK, &none, nullptr) != 0) throw system_error("sigprocmask");
}

}  // namespace sqbox
