/* The pod sandbox process of `cargo xtask cluster` (its image: kpulse.local/pause).
 * It holds the pod's namespaces open, reaps children reparented to it (it is PID 1 of the
 * pod), and exits on SIGINT or SIGTERM. Built static with the host's gcc. */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>

int main(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &set, NULL) != 0)
        return 1;
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0)
            continue;
        if (sig != SIGCHLD)
            return 0;
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
}
