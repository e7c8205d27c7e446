#!/usr/bin/env python3
"""Checks that the docs stay true to the repository and the binary.

  python3 scripts/check-docs.py [--bin target/release/orderly] [--self-test]

1. Links: every relative link and image in the Markdown files a reader opens (README.md,
   CHANGELOG.md, docs/, client/README.md, perf/README.md, torture/README.md) names a file that
   exists, and its #anchor a heading of that file (GitHub's anchors: lowercase, punctuation
   dropped, spaces to '-', repeats numbered). Links inside code are not links.
2. File names: every name of a file those pages give, in their text or in code (`src/x.rs`,
   `BENCHMARKS.md`), names a file the repository has: a path from the root or from the page,
   or, for a bare name, some file of that name. Names with placeholders (`<`, `{`, `*`), and
   absolute paths (`/tmp/…`), are examples, not files.
3. Flags (with --bin): every flag each command's `--help` prints has a row of its own in
   docs/operations.md's tables ("Every flag of `orderly serve`", "Every flag of the other
   commands"), and every row names a flag the binary has.
6. CI steps: every step `.ci/run` announces (`step "NAME"`) has an item `- **NAME**` under
   docs/testing.md's "What CI runs" (a `$variable` in a name stands for any text), and every
   item there names a step.
5. Answers (with --bin): every response body README.md and docs/api.md show is the body the
   real server gives for that request: scripts/doc_examples.py starts the binary with --demo,
   sends each labelled request and compares (fields, their order, and every value but what
   differs from run to run).
4. Routes (with --bin): the route table (`routes()` in src/api/mod.rs) and the paths of the
   OpenAPI document the server serves are the same, both ways (the console's page and files,
   HTML and not API, excepted); and every route of that document appears in docs/api.md as
   "METHOD /path".

--self-test shows each check failing: it plants one mistake of each kind into copies of the
pages and the route table (in memory) and exits 1 unless each check then reports exactly it.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_examples  # noqa: E402  (beside this file)

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PAGES = ["README.md", "CHANGELOG.md", "client/README.md", "perf/README.md", "torture/README.md"]
ROUTE_TABLE = "src/api/mod.rs"
COMMANDS = ["serve", "stats", "restore", "migrate", "copy", "verify"]
SERVE_TABLE = "Every flag of `orderly serve`"
OTHER_TABLE = "Every flag of the other commands"
# Served by the route table but not API: the console's page and its files (docs/api.md says so).
NOT_IN_OPENAPI = ("/console",)
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


FILE_NAME = re.compile(
    r"(?<![\w./<{*-])((?:[\w.-]+/)*[\w-]+\.(?:md|rs|sh|py|toml|sql|lua|js|css|html|json|yml|yaml))(?![\w/>}*-])"
)


def repository_files():
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    return set(listed)


# What the build makes: named by the docs, never in the repository.
BUILT = ("target/",)


def names_a_file(name, here, files, basenames):
    """Whether `name`, given on a page in directory `here`, names a file of the repository."""
    if "/" not in name:
        return name in basenames
    candidates = {os.path.normpath(name), os.path.normpath(os.path.join(here, name))}
    if candidates & files:
        return True
    # A path given from a folder the sentence names (`domain/cidr.rs` in src/).
    return any(f.endswith("/" + name) for f in files)


def check_file_names(overlay=None, files=None):
    """Every file a page names exists (see the module's note for what counts as a name). In
    a fenced block (a command to type) only paths into the repository's own folders are
    names of its files; the rest are the reader's (`basket.json`, `./fulfil.sh`)."""
    overlay = overlay or {}
    files = files if files is not None else repository_files()
    basenames = {os.path.basename(f) for f in files}
    top = {f.split("/", 1)[0] for f in files if "/" in f}
    problems = []
    for page in pages() + [p for p in overlay if p not in pages()]:
        here = os.path.dirname(page)
        fenced = False
        for lineno, line in enumerate(read(page, overlay).split("\n"), 1):
            if re.match(r"^\s*(```|~~~)", line):
                fenced = not fenced
                continue
            for name in FILE_NAME.findall(line):
                if re.search(r"https?://\S*" + re.escape(name), line) or name.startswith(BUILT):
                    continue  # part of a URL, or what a build makes
                if fenced and name.split("/", 1)[0] not in top:
                    continue
                if not names_a_file(name, here, files, basenames):
                    problems.append(f"{page}:{lineno}: {name}: no such file in the repository")
    return problems


# Source files whose comments are checked, and how a comment starts in each.
COMMENT_MARKERS = {".rs": "//", ".sh": "#", ".py": "#", ".sql": "--", ".lua": "--", ".toml": "#",
                   ".js": "//", ".css": "/*"}
CODE_DIRS = ("src/", "tests/", "scripts/", "client/", "perf/", "benches/", "examples/",
             "torture/", ".ci/", "build.rs", "Cargo.toml")
# An issue of a tracker the repository does not hold; upstream projects' trackers are public.
ISSUE = re.compile(r"(?<![\w-])(?<!sled )(?<!upstream )(?<!sled's )issues? #?\d+", re.I)
SECTION = re.compile(r"§\s*\d")


def comment_of(line, marker):
    """The comment on a line of code, or None: the first marker outside a string (one that
    follows an even number of double quotes)."""
    at = line.find(marker)
    while at >= 0 and line[:at].count('"') % 2 == 1:
        at = line.find(marker, at + 1)
    return None if at < 0 else line[at + len(marker):]


def check_comments(overlay=None, files=None):
    """Comments cite only what the repository holds: no issue of a tracker it does not
    contain, no numbered section of a document it does not contain, no file it lacks."""
    overlay = overlay or {}
    files = files if files is not None else repository_files()
    basenames = {os.path.basename(f) for f in files}
    problems = []
    sources = sorted(f for f in set(files) | set(overlay) if f.startswith(CODE_DIRS)
                     and os.path.splitext(f)[1] in COMMENT_MARKERS and not f.startswith("vendor/"))
    for path in sources:
        marker = COMMENT_MARKERS[os.path.splitext(path)[1]]
        try:
            text = read(path, overlay)
        except (OSError, UnicodeDecodeError):
            continue
        here = os.path.dirname(path)
        for lineno, line in enumerate(text.split("\n"), 1):
            comment = comment_of(line, marker)
            if comment is None:
                continue
            for found in ISSUE.findall(comment):
                problems.append(f"{path}:{lineno}: \"{found}\": cites a tracker the repository does not hold")
            if SECTION.search(comment):
                problems.append(f"{path}:{lineno}: cites a numbered section (§) no document of the repository has")
            for name in FILE_NAME.findall(comment):
                if re.search(r"https?://\S*" + re.escape(name), comment) or name.startswith(BUILT):
                    continue
                if not names_a_file(name, here, files, basenames):
                    problems.append(f"{path}:{lineno}: {name}: no such file in the repository")
    return problems


def command_flags(binary):
    """Each command's flags, as its `--help` prints them."""
    result = {}
    for command in COMMANDS:
        help_text = subprocess.run(
            [binary, command, "--help"], capture_output=True, text=True, check=True
        ).stdout
        flags = set(re.findall(r"^\s+(?:-\w,\s+)?(--[a-z0-9][a-z0-9-]*)", help_text, re.M))
        result[command] = sorted(flags - IGNORED_FLAGS)
    return result


def table_under(text, heading):
    """The rows (lists of cells) of the first table after the heading, header rows dropped."""
    lines = text.split("\n")
    start = next((i for i, l in enumerate(lines) if re.match(r"^#+\s+" + re.escape(heading) + r"\s*$", l)), None)
    if start is None:
        return None
    rows, in_table = [], False
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            in_table = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not re.match(r"^-+$", cells[0]) and cells[0] not in ("flag", "command"):
                rows.append(cells)
        elif in_table:
            break
    return rows


def documented_flags(text):
    """{command: {flag: row number}} from docs/operations.md's two flag tables."""
    found = {command: {} for command in COMMANDS}
    for n, cells in enumerate(table_under(text, SERVE_TABLE) or [], 1):
        for flag in re.findall(r"`(--[a-z0-9-]+)`", cells[0]):
            found["serve"][flag] = n
    for n, cells in enumerate(table_under(text, OTHER_TABLE) or [], 1):
        command = re.match(r"`orderly (\w+)`", cells[0])
        if command and command.group(1) in found and len(cells) > 1:
            for flag in re.findall(r"`(--[a-z0-9-]+)`", cells[1]):
                found[command.group(1)][flag] = n
    return found


def check_flags(flags, overlay=None):
    """Each command's flags have a row of their own, and each row's flag exists."""
    text = read(OPERATIONS, overlay or {})
    documented = documented_flags(text)
    problems = []
    for command, printed in flags.items():
        table = SERVE_TABLE if command == "serve" else OTHER_TABLE
        for flag in printed:
            if flag not in documented[command]:
                problems.append(
                    f"{OPERATIONS}: `{flag}` (printed by `orderly {command} --help`) has no row in \"{table}\""
                )
        for flag in sorted(documented[command]):
            if flag not in printed:
                problems.append(
                    f"{OPERATIONS}: `{flag}` has a row in \"{table}\" but `orderly {command}` has no such flag"
                )
    return problems


def route_table(overlay=None):
    """"METHOD /path" of every route `routes()` registers."""
    text = read(ROUTE_TABLE, overlay or {})
    body = text[re.search(r"\bfn routes\(", text).start():]
    body = body[: body.index("\n}\n")]
    routes = []
    for resource in re.split(r"web::resource\(", body)[1:]:
        path = re.match(r'\s*"([^"]+)"', resource).group(1)
        for method in re.findall(r"\.route\(web::(get|post|put|patch|delete)\(\)", resource):
            routes.append(f"{method.upper()} {path}")
    return sorted(routes)


def check_route_table(table, document_routes):
    """The route table and the OpenAPI paths, compared both ways."""
    to_openapi = lambda r: re.sub(r"\{[^}]+\}", "{}", r)
    served = {to_openapi(r): r for r in table if not r.split(" ", 1)[1].startswith(NOT_IN_OPENAPI)}
    described = {to_openapi(r): r for r in document_routes}
    problems = [
        f"{ROUTE_TABLE}: {served[k]} is served but not in /openapi.json"
        for k in sorted(served.keys() - described.keys())
    ]
    problems += [
        f"/openapi.json: {described[k]} is described but {ROUTE_TABLE} serves no such route"
        for k in sorted(described.keys() - served.keys())
    ]
    return problems


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


CI = ".ci/run"
TESTING = "docs/testing.md"
CI_SECTION = "## What CI runs"


def check_ci_steps(overlay=None):
    steps = [m.group(1) for m in re.finditer(r'^step "(.*)"$', read(CI, overlay or {}), re.M)]
    steps = [s for s in steps if s != "done"]
    text = read(TESTING, overlay or {})
    if CI_SECTION not in text:
        return [f"{TESTING}: no section \"{CI_SECTION[3:]}\" describing the steps of {CI}"]
    section = text.split(CI_SECTION, 1)[1].split("\n## ", 1)[0]
    items = [" ".join(item.split()) for item in re.split(r"^- ", section, flags=re.M)[1:]]
    names = [m.group(1) for m in (re.match(r"\*\*(.+?)\*\*", item) for item in items) if m]
    patterns = {s: re.compile(re.sub(r"\\\$\w+", ".+?", re.escape(s))) for s in steps}
    problems = [
        f"{TESTING}: the CI step \"{s}\" has no item under \"{CI_SECTION[3:]}\""
        for s, p in patterns.items() if not any(p.fullmatch(n) for n in names)
    ]
    problems += [
        f"{TESTING}: \"{n}\" (under \"{CI_SECTION[3:]}\") is not a step of {CI}"
        for n in names if not any(p.fullmatch(n) for p in patterns.values())
    ]
    return problems


def check_answers(sent, overlay=None):
    problems, _ = doc_examples.check(ROOT, sent, overlay)
    return problems


def self_test_answers(sent):
    """Bodies the server gives, planted back as they once were (without `code`), and one
    example without a label: each is reported, and nothing else."""
    failures = []
    pages = {p: read(p, {}) for p in doc_examples.PAGES}
    plants = [
        ("docs/api.md", ',"code":"INVALID_API_KEY"}`;', '}`;', "invalid-api-key"),
        ("docs/api.md", ',"code":"INVALID_SIGNATURE"}`', "}`", "invalid-signature"),
        ("README.md", '","code":"IDEMPOTENCY_KEY_REUSED"}', '"}', "key-reused"),
        ("docs/api.md", '"status":"ok"}`', '"status":"up"}`', "healthz"),
        ("docs/api.md", "\n## Errors\n", '\n`{"success":true}`\n\n## Errors\n', "without a label"),
    ]
    for page, was, planted, want in plants:
        if was not in pages[page]:
            failures.append(f"answers: {was!r} is not in {page} to plant from")
            continue
        found = check_answers(sent, {page: pages[page].replace(was, planted, 1)})
        if len(found) != 1 or want not in found[0] or not found[0].startswith(page):
            failures.append(f"answers: expected one problem ({want}) in {page}, got {found}")
    return failures


def self_test(flags, routes, sent=None):
    """Each check must fail, with exactly the problem made, on pages that lack one thing."""
    failures = []
    api = read(API, {})
    broken = api + "\n\nSee [a page](operations.md#no-such-heading) and [another](missing.md).\n"
    found = check_links({API: broken})
    expected = ["no heading #no-such-heading", "missing.md: no such file"]
    if len(found) != 2 or not all(any(e in f for f in found) for e in expected):
        failures.append(f"links: expected two problems in {API}, got {found}")
    planted = api + "\n\nThe figures are in BENCHMARKS.md and `src/store/nowhere.rs`.\n"
    already = set(check_file_names())
    found = [f for f in check_file_names({API: planted}) if f not in already]
    if len(found) != 2 or not ("BENCHMARKS.md" in found[0] and "src/store/nowhere.rs" in found[1]):
        failures.append(f"file names: expected BENCHMARKS.md and src/store/nowhere.rs, got {found}")
    code = "src/domain/money.rs"
    planted = read(code, {}) + "\n// See BENCHMARKS.md, issue 41 and contract §23.\n"
    already = set(check_comments())
    found = [f for f in check_comments({code: planted}) if f not in already]
    kinds = ["BENCHMARKS.md", "issue 41", "§"]
    if len(found) != 3 or not all(any(k in f for f in found) for k in kinds):
        failures.append(f"comments: expected a file, an issue and a section in {code}, got {found}")
    if flags:
        operations = read(OPERATIONS, {})
        for command in ["serve", "restore"]:
            flag = flags[command][0]
            table = SERVE_TABLE if command == "serve" else OTHER_TABLE
            # The flag's row taken out (a row of several flags keeps the others).
            pattern = (r"^\| `" + re.escape(flag) + r"` \|.*\n" if command == "serve"
                       else r"^\| `orderly " + command + r"` \| `" + re.escape(flag) + r"` \|.*\n")
            gone = re.sub(pattern, "", operations, count=1, flags=re.M)
            found = check_flags(flags, {OPERATIONS: gone})
            want = f"{OPERATIONS}: `{flag}` (printed by `orderly {command} --help`) has no row in \"{table}\""
            if found != [want]:
                failures.append(f"flags: expected {command} {flag} alone to be missing, got {found}")
        extra = re.sub(r"^(\| `--listen` \|)", "| `--no-such-flag` | x | y |\n\\1", operations, count=1, flags=re.M)
        found = check_flags(flags, {OPERATIONS: extra})
        if len(found) != 1 or "--no-such-flag" not in found[0]:
            failures.append(f"flags: expected the row of --no-such-flag alone to be refused, got {found}")
    if routes:
        route = routes[0]
        gone = re.sub(re.escape(route) + r"(?![\w/{}-])", "", api)
        found = check_routes(routes, {API: gone})
        if found != [f"{API}: {route} (a route of /openapi.json) is not documented"]:
            failures.append(f"routes: expected {route} alone to be missing, got {found}")
        table = read(ROUTE_TABLE, {})
        unserved = re.sub(r'\.route\(web::get\(\)\.to\(ops::healthz\)\)', "", table, count=1)
        found = check_route_table(route_table({ROUTE_TABLE: unserved}), routes)
        if found != [f"/openapi.json: GET /healthz is described but {ROUTE_TABLE} serves no such route"]:
            failures.append(f"route table: expected GET /healthz unserved, got {found}")
        found = check_route_table(route_table() + ["GET /b2b/secret"], routes)
        if found != [f"{ROUTE_TABLE}: GET /b2b/secret is served but not in /openapi.json"]:
            failures.append(f"route table: expected GET /b2b/secret undescribed, got {found}")
    testing = read(TESTING, {})
    gone = re.sub(r"^- \*\*disk full.*\n(  .*\n)*", "", testing, count=1, flags=re.M)
    found = check_ci_steps({TESTING: gone})
    if len(found) != 1 or "disk full" not in found[0]:
        failures.append(f"CI steps: expected the disk-full step alone to be undescribed, got {found}")
    if sent:
        failures += self_test_answers(sent)
    for line in failures:
        print(f"check-docs self-test: {line}")
    if not failures:
        print(
            "check-docs self-test: each check fails as it should "
            "(a missing heading and file, two file names, a file, an issue and a section in a "
            "comment, a serve and a restore flag without "
            "their rows and a row without its flag, "
            f"{routes[0] if routes else 'no route'} undocumented, a route unserved and one undescribed, "
            "a CI step without its item"
            f"{', four answers as they once were and one without a label' if sent else ''})"
        )
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", help="an orderly binary: also check its flags and routes")
    parser.add_argument("--self-test", action="store_true", help="show each check failing")
    args = parser.parse_args()
    flags = command_flags(args.bin) if args.bin else {}
    routes = openapi_routes(args.bin) if args.bin else []
    sent = doc_examples.scenario(args.bin, ROOT) if args.bin else {}
    if args.self_test:
        return 1 if self_test(flags, routes, sent) else 0
    problems = check_links() + check_file_names() + check_comments() + check_ci_steps()
    counts = {"sent": 0, "shape": 0, "not sent": 0}
    if args.bin:
        problems += check_flags(flags) + check_routes(routes)
        problems += check_route_table(route_table(), routes)
        answer_problems, counts = doc_examples.check(ROOT, sent)
        problems += answer_problems
    for line in problems:
        print(line)
    pages_checked = len(pages())
    print(
        f"check-docs: {pages_checked} pages, {sum(len(f) for f in flags.values())} flags of "
        f"{len(flags)} commands, {len(routes)} routes, {counts['sent']} answers sent and compared "
        f"({counts['shape']} shapes, {counts['not sent']} not sent): {len(problems)} problems"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
