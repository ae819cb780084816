"""A one-way delay between two network namespaces, for kernels without netem.

The emulated link of :mod:`tmpi_adapters.bench.network` adds latency with
this: a small C program (:data:`SOURCE`, compiled on first use with the
system compiler into tmpi's cache) that creates a TAP device in each of two
namespaces and forwards every frame read from one to the other a fixed delay
after it was read, first in first out per direction.  Frames cross as 64 KB
GSO frames (``IFF_VNET_HDR``), one system call each.

Its costs, measured on a 2-core VM: about 25 µs of its own per hop on top of
the delay, and 1-1.5 CPU-seconds per GB forwarded (the ranks compete with it
for the cores; it runs SCHED_FIFO when allowed, so that polling ranks cannot
hold frames back).  It exits when its parent dies, on SIGTERM, or when its
standard input closes; its TAP devices vanish with it.
"""
import json
import os
import subprocess

from tmpi_adapters import native
from tmpi_adapters.errors import TmpiError

SOURCE = r'''
/* tmpi delay line: NS0 TAP0 NS1 TAP1 DELAY_NS SPIN_NS MARGIN_NS */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define SLOTS 512
#define FRAME (65536 + 64)

typedef struct { uint64_t due; int len; unsigned char *buf; } slot_t;
typedef struct {
    slot_t s[SLOTS]; unsigned head, tail;
    uint64_t frames, bytes, late_sum, late_max, full;
} queue_t;

static volatile sig_atomic_t stop;
static void on_signal(int s) { (void)s; stop = 1; }

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* A TAP device named `name` in network namespace `ns` (left joined). */
static int open_tap(const char *ns, const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns);
    int nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) < 0) { perror(path); exit(2); }
    close(nsfd);
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) { perror("/dev/net/tun"); exit(2); }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
    strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) { perror("TUNSETIFF"); exit(2); }
    /* Offloads on: 64 KB segments cross in one read and one write. */
    ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN);
    return fd;
}

int main(int argc, char **argv) {
    if (argc < 8) { fprintf(stderr, "usage: NS0 TAP0 NS1 TAP1 DELAY SPIN MARGIN (ns)\n"); return 2; }
    uint64_t delay = strtoull(argv[5], 0, 10), spin = strtoull(argv[6], 0, 10);
    uint64_t margin = strtoull(argv[7], 0, 10);
    int fd[2];
    fd[0] = open_tap(argv[1], argv[2]);
    fd[1] = open_tap(argv[3], argv[4]);
    prctl(PR_SET_TIMERSLACK, 1UL);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    signal(SIGTERM, on_signal); signal(SIGINT, on_signal); signal(SIGPIPE, SIG_IGN);
    static queue_t q[2];   /* q[d]: frames read from fd[d], due to be written to fd[1-d] */
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < SLOTS; i++)
            if (!(q[d].s[i].buf = malloc(FRAME))) return 3;
    printf("ready\n");
    fflush(stdout);
    while (!stop) {
        uint64_t now = now_ns();
        int moved = 0;
        for (int d = 0; d < 2; d++) {          /* deliver the frames that are due */
            queue_t *Q = &q[d];
            while (Q->head != Q->tail) {
                slot_t *s = &Q->s[Q->head % SLOTS];
                if (s->due > now) break;
                if (write(fd[1 - d], s->buf, (size_t)s->len) < 0 && errno == EAGAIN) break;
                uint64_t late = now - s->due;
                Q->late_sum += late;
                if (late > Q->late_max) Q->late_max = late;
                Q->frames++; Q->bytes += (uint64_t)s->len; Q->head++; moved = 1;
            }
        }
        for (int d = 0; d < 2; d++) {          /* take new frames in */
            queue_t *Q = &q[d];
            if (Q->tail - Q->head >= SLOTS) { Q->full++; continue; }
            for (int k = 0; k < 64 && Q->tail - Q->head < SLOTS; k++) {
                slot_t *s = &Q->s[Q->tail % SLOTS];
                ssize_t r = read(fd[d], s->buf, FRAME);
                if (r <= 0) break;
                s->len = (int)r; s->due = now_ns() + delay; Q->tail++; moved = 1;
            }
        }
        if (moved) continue;
        now = now_ns();
        uint64_t next = UINT64_MAX;
        for (int d = 0; d < 2; d++)
            if (q[d].head != q[d].tail && q[d].s[q[d].head % SLOTS].due < next)
                next = q[d].s[q[d].head % SLOTS].due;
        if (next != UINT64_MAX && next <= now + spin) continue;   /* spin the last stretch */
        struct pollfd p[3];
        int n = 0;
        for (int d = 0; d < 2; d++)
            if (q[d].tail - q[d].head < SLOTS) { p[n].fd = fd[d]; p[n].events = POLLIN; n++; }
        int in = n;
        p[n].fd = 0; p[n].events = POLLIN; n++;
        struct timespec ts, *timeout = NULL;
        if (next != UINT64_MAX) {
            uint64_t w = next - now;
            w = w > spin + margin ? w - spin - margin : 0;
            ts.tv_sec = (time_t)(w / 1000000000ull); ts.tv_nsec = (long)(w % 1000000000ull);
            timeout = &ts;
        }
        if (ppoll(p, (nfds_t)n, timeout, NULL) > 0 && (p[in].revents & (POLLIN | POLLHUP | POLLERR))) {
            char b[64];
            if (read(0, b, sizeof b) <= 0) break;   /* the parent closed our stdin */
        }
    }
    fprintf(stderr, "{\"frames\": [%llu, %llu], \"bytes\": [%llu, %llu], "
            "\"late_mean_ns\": [%llu, %llu], \"late_max_ns\": [%llu, %llu], "
            "\"queue_full\": [%llu, %llu]}\n",
            (unsigned long long)q[0].frames, (unsigned long long)q[1].frames,
            (unsigned long long)q[0].bytes, (unsigned long long)q[1].bytes,
            (unsigned long long)(q[0].frames ? q[0].late_sum / q[0].frames : 0),
            (unsigned long long)(q[1].frames ? q[1].late_sum / q[1].frames : 0),
            (unsigned long long)q[0].late_max, (unsigned long long)q[1].late_max,
            (unsigned long long)q[0].full, (unsigned long long)q[1].full);
    return 0;
}
'''

#: Below the delay, the line busy-waits the last SPIN seconds before a frame
#: is due, and wakes MARGIN earlier than that (a VM's timers are late).
SPIN_S = 5e-6
MARGIN_S = 15e-6


def unavailable():
    """Why no delay line can run here, or ``None``."""
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (the delay line needs TAP devices)"
    return None


def executable():
    """The compiled delay line (built once, cached by its source's hash)."""
    try:
        return native.build(SOURCE, "delayline", library=False)
    except subprocess.CalledProcessError as exc:
        raise TmpiError("could not build the delay line with %s: %s"
                        % (native.compiler(), exc.stderr.strip()[-500:]))


def start(namespaces, ifname, delay_s):
    """Start a delay line of ``delay_s`` between TAP devices ``ifname`` in
    the two ``namespaces``; the running :class:`subprocess.Popen`."""
    argv = [executable(), namespaces[0], ifname, namespaces[1], ifname,
            str(int(round(delay_s * 1e9))), str(int(SPIN_S * 1e9)), str(int(MARGIN_S * 1e9))]
    line = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if line.stdout.readline().strip() != "ready":
        line.wait()
        raise TmpiError("the delay line did not start: %s" % line.stderr.read().strip())
    try:  # polling ranks must not hold frames back
        os.sched_setscheduler(line.pid, os.SCHED_FIFO, os.sched_param(10))
    except OSError:
        pass  # not allowed here: the line still works, with more jitter
    return line


def stop(line):
    """End a delay line; its counters (frames, bytes, lateness per direction)."""
    try:
        line.stdin.close()  # it exits when its standard input closes
        line.wait(timeout=3)
    except subprocess.TimeoutExpired:
        line.kill()
        line.wait()
    try:
        return json.loads(line.stderr.read().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
