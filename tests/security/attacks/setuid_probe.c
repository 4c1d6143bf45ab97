/* Installed setuid (and with file capabilities where the test can set them) in a hostile image.
 * Prints what it got when executed inside the sandbox, as "key value" lines. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    uid_t ruid, euid, suid;
    gid_t rgid, egid, sgid;
    getresuid(&ruid, &euid, &suid);
    getresgid(&rgid, &egid, &sgid);
    printf("ruid %u\neuid %u\nsuid %u\nrgid %u\negid %u\nsgid %u\n", ruid, euid, suid, rgid, egid,
           sgid);
    FILE* status = fopen("/proc/self/status", "r");
    char line[256];
    while (status && fgets(line, sizeof line, status)) {
        if (strncmp(line, "Cap", 3) == 0 || strncmp(line, "NoNewPrivs", 10) == 0) {
            char* colon = strchr(line, ':');
            *colon = ' ';
            char *out = line, *in = line;
            for (; *in; ++in) /* squeeze the tab */
                if (*in != '\t') *out++ = *in;
            *out = 0;
            fputs(line, stdout);
        }
    }
    errno = 0;
    int r = setresuid(0, 0, 0);
    printf("setresuid0 %d %d\n", r, r < 0 ? errno : 0);
    errno = 0;
    r = unshare(CLONE_NEWNS);
    printf("unshare_newns %d %d\n", r, r < 0 ? errno : 0);
    errno = 0;
    r = chroot("/tmp");
    printf("chroot %d %d\n", r, r < 0 ? errno : 0);
    printf("done\n");
    return 0;
}
