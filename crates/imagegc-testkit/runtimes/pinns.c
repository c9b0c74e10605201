/*
 * A minimal stand-in for CRI-O's pinns, for imagegc's test bed.
 *
 * CRI-O runs `pinns -d DIR -f NAME [-s key=value]... [--ipc[=host]]
 * [--uts[=host]] [--net[=host]] [--user[=host]] [--cgroup] [--mnt]` to
 * create a pod's namespaces and pin each one by bind-mounting it on
 * DIR/<type>ns/NAME, where CRI-O then finds it (internal/config/nsmgr).
 * This one unshares the requested namespaces in its own process (it is
 * single-threaded, so unshare(2) applies to it), applies the sysctls inside
 * them, and bind-mounts /proc/self/ns/<type> onto each pin file. `=host`
 * pins the namespace the process already is in. User namespaces with id
 * mappings are not supported: the test bed's pods do not ask for them.
 *
 * Build: gcc -O2 -Wall -o pinns pinns.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SYSCTLS 64

struct ns {
    const char *name; /* as in /proc/self/ns and the pin dir (<name>ns) */
    int flag;
    int wanted;
    int host;
};

static struct ns namespaces[] = {
    {"ipc", CLONE_NEWIPC, 0, 0},
    {"uts", CLONE_NEWUTS, 0, 0},
    {"net", CLONE_NEWNET, 0, 0},
    {"user", CLONE_NEWUSER, 0, 0},
    {"cgroup", CLONE_NEWCGROUP, 0, 0},
    {"mnt", CLONE_NEWNS, 0, 0},
};

static void die(const char *what, const char *detail) {
    fprintf(stderr, "pinns: %s%s%s: %s\n", what, detail ? " " : "", detail ? detail : "", strerror(errno));
    exit(1);
}

static void want(int index, const char *arg) {
    namespaces[index].wanted = 1;
    namespaces[index].host = arg != NULL && strcmp(arg, "host") == 0;
}

/* Writes one `key=value` sysctl: dots in the key are path separators. */
static void apply_sysctl(char *setting) {
    char *eq = strchr(setting, '=');
    if (eq == NULL) {
        errno = EINVAL;
        die("bad sysctl", setting);
    }
    *eq = '\0';
    char path[4096] = "/proc/sys/";
    size_t at = strlen(path);
    for (const char *k = setting; *k && at + 1 < sizeof path; k++) {
        path[at++] = *k == '.' ? '/' : *k;
    }
    path[at] = '\0';
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        die("opening", path);
    }
    const char *value = eq + 1;
    if (write(fd, value, strlen(value)) < 0) {
        die("writing", path);
    }
    close(fd);
}

static void mkdir_p(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(path, 0755) < 0 && errno != EEXIST) {
                die("creating", path);
            }
            *p = '/';
        }
    }
    if (mkdir(path, 0755) < 0 && errno != EEXIST) {
        die("creating", path);
    }
}

static void pin(const char *dir, const char *file, const char *name) {
    char pin_dir[4096], pin_path[8192], source[64];
    if (snprintf(pin_dir, sizeof pin_dir, "%s/%sns", dir, name) >= (int)sizeof pin_dir) {
        errno = ENAMETOOLONG;
        die("pin directory", dir);
    }
    snprintf(pin_path, sizeof pin_path, "%s/%s", pin_dir, file);
    snprintf(source, sizeof source, "/proc/self/ns/%s", name);
    mkdir_p(pin_dir);
    int fd = open(pin_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        die("creating", pin_path);
    }
    close(fd);
    if (mount(source, pin_path, NULL, MS_BIND, NULL) < 0) {
        die("bind-mounting onto", pin_path);
    }
}

int main(int argc, char **argv) {
    static const struct option options[] = {
        {"uts", optional_argument, NULL, 'u'},
        {"ipc", optional_argument, NULL, 'i'},
        {"net", optional_argument, NULL, 'n'},
        {"user", optional_argument, NULL, 'U'},
        {"cgroup", optional_argument, NULL, 'c'},
        {"mnt", optional_argument, NULL, 'm'},
        {"dir", required_argument, NULL, 'd'},
        {"filename", required_argument, NULL, 'f'},
        {"sysctl", required_argument, NULL, 's'},
        {"uid-mapping", required_argument, NULL, 'X'},
        {"gid-mapping", required_argument, NULL, 'Y'},
        {NULL, 0, NULL, 0},
    };
    const char *dir = NULL, *file = NULL;
    char *sysctls[MAX_SYSCTLS];
    int n_sysctls = 0, c;
    while ((c = getopt_long(argc, argv, "uUincmd:f:s:", options, NULL)) != -1) {
        switch (c) {
        case 'i': want(0, optarg); break;
        case 'u': want(1, optarg); break;
        case 'n': want(2, optarg); break;
        case 'U': want(3, optarg); break;
        case 'c': want(4, optarg); break;
        case 'm': want(5, optarg); break;
        case 'd': dir = optarg; break;
        case 'f': file = optarg; break;
        case 's':
            /* Several sysctls may come in one argument, joined by '+'. */
            for (char *s = strtok(optarg, "+"); s != NULL; s = strtok(NULL, "+")) {
                if (n_sysctls == MAX_SYSCTLS) {
                    errno = E2BIG;
                    die("too many sysctls", NULL);
                }
                sysctls[n_sysctls++] = s;
            }
            break;
        case 'X':
        case 'Y':
            errno = ENOTSUP;
            die("id mappings are not supported by this pinns", NULL);
            break;
        default:
            fprintf(stderr, "usage: pinns -d DIR -f FILE [-s key=value] [--ipc] [--uts] [--net] [--user] [--cgroup] [--mnt]\n");
            return 2;
        }
    }
    if (dir == NULL || file == NULL) {
        fprintf(stderr, "pinns: -d and -f are required\n");
        return 2;
    }
    int flags = 0;
    for (size_t i = 0; i < sizeof namespaces / sizeof namespaces[0]; i++) {
        if (namespaces[i].wanted && namespaces[i].host) {
            /* The namespace this process is in: pinned before unsharing. */
            pin(dir, file, namespaces[i].name);
        } else if (namespaces[i].wanted) {
            flags |= namespaces[i].flag;
        }
    }
    if (flags != 0 && unshare(flags) < 0) {
        die("unshare", NULL);
    }
    for (int i = 0; i < n_sysctls; i++) {
        apply_sysctl(sysctls[i]);
    }
    for (size_t i = 0; i < sizeof namespaces / sizeof namespaces[0]; i++) {
        if (namespaces[i].wanted && !namespaces[i].host) {
            pin(dir, file, namespaces[i].name);
        }
    }
    return 0;
}
