#!/usr/bin/env python3
"""Checks that the docs stay true to the repository and the binary.

  python3 scripts/check-docs.py [--bin target/release/orderly] [--self-test]

1. Links: every relative link and image in the Markdown files a reader opens (README.md,
   docs/, client/README.md, perf/README.md, torture/README.md) names a file that exists, and its #anchor a
   heading of that file (GitHub's anchors: lowercase, punctuation dropped, spaces to '-',
   repeats numbered). Links inside code are not links.
2. Flags (with --bin): every flag `orderly serve --help` prints is documented in
   docs/operations.md, written as `--flag`.
3. Routes (with --bin): every route of the OpenAPI document the server serves appears in
   docs/api.md as "METHOD /path".

--self-test shows each check failing: it takes a link target, a flag and a route out of
copies of the pages (in memory) and exits 1 unless each check then reports exactly that.
Exit status: 0 when everything holds, 1 with one line per problem otherwise.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PAGES = ["README.md", "client/README.md", "perf/README.md", "torture/README.md"]
OPERATIONS = "docs/operations.md"
API = "docs/api.md"
IGNORED_FLAGS = {"--help", "--version"}


def pages():
    found = [p for p in PAGES if os.path.exists(os.path.join(ROOT, p))]
    docs = os.path.join(ROOT, "docs")
    for dirpath, _, files in os.walk(docs):
        for name in sorted(files):
            if name.endswith(".md"):
                found.append(os.path.relpath(os.path.join(dirpath, name), ROOT))
    return found


def read(path, overlay):
    if path in overlay:
        return overlay[path]
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def without_code(text):
    """The text with fenced blocks and inline code spans blanked (lines are kept)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if re.match(r"^\s*(```|~~~)", line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`+[^`]*`+", "", line))
    return "\n".join(out)


def slug(heading):
    text = re.sub(r"<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text):
    """The anchors of a page's headings (code spans keep their text in a heading's anchor)."""
    seen, result, fenced = {}, set(), False
    for line in text.split("\n"):
        if re.match(r"^\s*(```|~~~)", line):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1).replace("`", ""))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
    return result


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def check_links(overlay=None):
    overlay = overlay or {}
    problems = []
    for page in pages() + [p for p in overlay if p not in pages()]:
        text = read(page, overlay)
        for lineno, line in enumerate(without_code(text).split("\n"), 1):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                    continue  # http:, https:, mailto:
                path, _, anchor = target.partition("#")
                here = os.path.dirname(page)
                dest = os.path.normpath(os.path.join(here, path)) if path else page
                if dest.startswith(".."):
                    problems.append(f"{page}:{lineno}: {target}: points outside the repository")
                    continue
                if dest not in overlay and not os.path.exists(os.path.join(ROOT, dest)):
                    problems.append(f"{page}:{lineno}: {target}: no such file")
                    continue
                if anchor and dest.endswith(".md") and anchor not in anchors(read(dest, overlay)):
                    problems.append(f"{page}:{lineno}: {target}: no heading #{anchor} in {dest}")
    return problems


def serve_flags(binary):
    help_text = subprocess.run(
        [binary, "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    flags = set(re.findall(r"^\s+(?:-\w,\s+)?(--[a-z0-9][a-z0-9-]*)", help_text, re.M))
    return sorted(flags - IGNORED_FLAGS)


def check_flags(flags, overlay=None):
    text = read(OPERATIONS, overlay or {})
    return [
        f"{OPERATIONS}: `{flag}` (printed by `orderly serve --help`) is not documented"
        for flag in flags
        if not re.search(r"`" + re.escape(flag) + r"(?![a-z0-9-])", text)
    ]


def openapi_routes(binary):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as data:
        server = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", f"{data}/db"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.time() + 30
            while True:
                try:
                    url = f"http://127.0.0.1:{port}/openapi.json"
                    with urllib.request.urlopen(url, timeout=2) as resp:
                        document = json.load(resp)
                    break
                except OSError:
                    if time.time() > deadline or server.poll() is not None:
                        raise SystemExit("check-docs: the server did not serve /openapi.json")
                    time.sleep(0.2)
        finally:
            server.terminate()
            server.wait(timeout=30)
    methods = {"get", "put", "post", "delete", "patch", "head", "options"}
    return sorted(
        f"{method.upper()} {path}"
        for path, item in document["paths"].items()
        for method in item
        if method in methods
    )


def check_routes(routes, overlay=None):
    text = read(API, overlay or {})
    return [
        f"{API}: {route} (a route of /openapi.json) is not documented"
        for route in routes
        if not re.search(re.escape(route) + r"(?![\w/{}-])", text)
    ]


def self_test(flags, routes):
    """Each check must fail, with exactly the problem made, on pages that lack one thing."""
    failures = []
    api = read(API, {})
    broken = api + "\n\nSee [a page](operations.md#no-such-heading) and [another](missing.md).\n"
    found = check_links({API: broken})
    expected = ["no heading #no-such-heading", "missing.md: no such file"]
    if len(found) != 2 or not all(any(e in f for f in found) for e in expected):
        failures.append(f"links: expected two problems in {API}, got {found}")
    if flags:
        flag = flags[0]
        operations = read(OPERATIONS, {})
        gone = re.sub("`" + re.escape(flag) + r"(?![a-z0-9-])", "`--", operations)
        found = check_flags(flags, {OPERATIONS: gone})
        if found != [f"{OPERATIONS}: `{flag}` (printed by `orderly serve --help`) is not documented"]:
            failures.append(f"flags: expected {flag} alone to be missing, got {found}")
    if routes:
        route = routes[0]
        gone = re.sub(re.escape(route) + r"(?![\w/{}-])", "", api)
        found = check_routes(routes, {API: gone})
        if found != [f"{API}: {route} (a route of /openapi.json) is not documented"]:
            failures.append(f"routes: expected {route} alone to be missing, got {found}")
    for line in failures:
        print(f"check-docs self-test: {line}")
    if not failures:
        print(
            "check-docs self-test: each check fails as it should "
            f"(a missing heading and file, {flags[0] if flags else 'no flag'}, "
            f"{routes[0] if routes else 'no route'})"
        )
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", help="an orderly binary: also check its flags and routes")
    parser.add_argument("--self-test", action="store_true", help="show each check failing")
    args = parser.parse_args()
    flags = serve_flags(args.bin) if args.bin else []
    routes = openapi_routes(args.bin) if args.bin else []
    if args.self_test:
        return 1 if self_test(flags, routes) else 0
    problems = check_links()
    if args.bin:
        problems += check_flags(flags) + check_routes(routes)
    for line in problems:
        print(line)
    pages_checked = len(pages())
    print(
        f"check-docs: {pages_checked} pages, {len(flags)} flags, {len(routes)} routes: "
        f"{len(problems)} problems"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
