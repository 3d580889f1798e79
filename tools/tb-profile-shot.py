#!/usr/bin/env python3
"""Screenshots TensorBoard's Profile tab (trace viewer, every host selected)
for a `kiln-run train --tensorboard DIR --trace-steps A:B` directory, in
headless Chromium; the README's docs/images/tensorboard-profile.png.

  tb-profile-shot.py DIR -o OUT.png [--click X,Y] [--chromium PATH]

Starts `tensorboard --logdir DIR` on 127.0.0.1 at a free port (killed at
the end), opens the Profile tab, picks the tool "Trace Viewer" and every
host, and with --click X,Y clicks that point of the 1600x900 page (a slice:
its details fill the pane below). Needs the playwright package (pip install
playwright) and a Chromium (Debian: apt-get install chromium; the default
--chromium is /usr/bin/chromium), tensorboard and tensorboard-plugin-profile.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logdir")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--click", help="X,Y: a point of the page to click before the picture")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    a = ap.parse_args()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        sys.exit("tb-profile-shot.py: needs the playwright package (%s): "
                 "pip install playwright" % e)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    board = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", a.logdir,
                              "--host", "127.0.0.1", "--port", str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        url = "http://127.0.0.1:%d" % port
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/data/plugins_listing", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline or board.poll() is not None:
                    sys.exit("tb-profile-shot.py: tensorboard did not start on %s" % url)
                time.sleep(0.5)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=a.chromium,
                                        args=["--no-sandbox", "--enable-unsafe-swiftshader"])
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            page.set_default_timeout(30000)
            page.goto(url + "/#profile")
            plugin = page.frame_locator('iframe[src*="plugin_entry"]')
            plugin.get_by_text("Tools (").wait_for()
            plugin.locator("mat-select").nth(1).click()
            plugin.get_by_role("option", name="Trace Viewer").click()
            time.sleep(4)
            page.mouse.click(30, 95)  # the side menu: sessions, tools, hosts
            time.sleep(2)
            plugin.locator("mat-select").nth(2).click()
            options = plugin.get_by_role("option")
            for i in range(options.count()):
                if options.nth(i).get_attribute("aria-selected") != "true":
                    options.nth(i).click()
            plugin.get_by_text("Apply Host Selection").click()
            time.sleep(8)
            page.mouse.click(30, 95)  # the menu closed: the timeline gets the width
            time.sleep(3)
            if a.click:
                x, y = (int(v) for v in a.click.split(","))
                page.mouse.click(x, y)
                time.sleep(2)
            page.screenshot(path=a.output)
            browser.close()
    finally:
        try:
            os.killpg(board.pid, signal.SIGTERM)
            board.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(board.pid, signal.SIGKILL)
    print("wrote %s from %s" % (a.output, a.logdir))


if __name__ == "__main__":
    main()
