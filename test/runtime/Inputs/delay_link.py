#!/usr/bin/env python3
"""A network link with a fixed one-way delay, for machines without netem.

  delay_link.py TAP_A TAP_B DELAY_MS

Creates the TAP devices TAP_A and TAP_B (as root; move them into network
namespaces and give them addresses afterwards: the link follows them),
prints "ready", and forwards every Ethernet frame read from one to the
other DELAY_MS milliseconds later, in order, until it is killed. Two TAP
devices joined this way stand in for `tc qdisc ... netem delay` on a
kernel that lacks sch_netem (two-hosts.sh --delay-ms, bench/latency.sh).
The delay is added per frame; frames are not dropped or reordered, and
with a large MTU on both ends a collective's bytes cross in few frames.
"""
import collections
import fcntl
import os
import struct
import sys
import threading
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000


def open_tap(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def forward(src, dst, delay):
    """Frames from src reach dst `delay` seconds after they were read."""
    queue = collections.deque()
    ready = threading.Condition()

    def writer():
        while True:
            with ready:
                while not queue:
                    ready.wait()
                due, frame = queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                os.write(dst, frame)
            except OSError:
                pass  # the other side is down (a cut link): the frame is lost

    threading.Thread(target=writer, daemon=True).start()
    while True:
        try:
            frame = os.read(src, 1 << 17)
        except OSError:
            time.sleep(0.01)  # down: nothing to read until it is up again
            continue
        with ready:
            queue.append((time.monotonic() + delay, frame))
            ready.notify()


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    a, b = open_tap(sys.argv[1]), open_tap(sys.argv[2])
    delay = float(sys.argv[3]) / 1000.0
    threading.Thread(target=forward, args=(a, b, delay), daemon=True).start()
    threading.Thread(target=forward, args=(b, a, delay), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
