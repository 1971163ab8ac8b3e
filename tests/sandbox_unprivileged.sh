#!/bin/sh
# Re-run the sandbox tests as an unprivileged user (nobody), when the caller is root.
#
# The sandbox has two paths: as root (a fresh uid per run, writable cgroups) and non-root (a
# user namespace whose inner uid is not 0, RLIMIT_NPROC in it as the process cap). `make test`
# runs the suite as its caller, so as root this script covers the other path. A non-root
# caller already ran that path, and this script does nothing.
#
# The venv's interpreter may live where nobody cannot go (pyenv under /root, mode 0700). The
# sandbox modules are stdlib-only, so a system interpreter of the same minor version serves,
# with the repository and the venv's site-packages (pytest, numpy) on PYTHONPATH. Where nobody
# cannot read those either (a clone under /root), a readable copy serves: the package, its
# pyproject.toml, these two test files and the installed packages they import, in a temporary
# directory removed at the end.
#
# The tests run under a throwaway venv of that interpreter (made here, readable by nobody),
# holding a copy of pytest and what it imports: the sandbox mounts its interpreter's prefix
# and the SWE harness puts that interpreter's site-packages on its path (`runner._site_dirs`),
# so the pytest-runner tests find pytest inside the sandbox too. PYTHONPATH alone would not
# do: the sandboxed child's environment is built from scratch and the venv's site-packages
# are not mounted there (these tests were left out with -k "not pytest" before).
#
# Usage: tests/sandbox_unprivileged.sh [PYTHON] [pytest args...]
set -eu
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
[ $# -gt 0 ] && shift
if [ "$(id -u)" != 0 ]; then
	echo "sandbox_unprivileged: not root, so the suite already ran the non-root path"
	exit 0
fi
REPO=$(pwd)
TESTS="tests/test_sandbox.py tests/test_swe_harness.py tests/test_swe_trusted_tree.py tests/test_sandbox_escapes.py"
as_nobody() {
	setpriv --reuid=65534 --regid=65534 --clear-groups \
		env -i HOME=/tmp PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 "$@"
}
ver=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')
vtuple=$(echo "$ver" | tr . ,)
site=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
copy=""
trap '[ -z "$copy" ] || rm -rf "$copy"' EXIT
if ! as_nobody test -r "$REPO/tests/test_sandbox.py" || ! as_nobody test -r "$site/pytest"; then
	copy=$(mktemp -d "${TMPDIR:-/tmp}/locojax-nobody.XXXXXX")
	mkdir "$copy/tests" "$copy/site"
	cp -R "$REPO/locojax" "$REPO/pyproject.toml" "$copy/"
	for t in $TESTS; do cp "$t" "$copy/tests/"; done
	# The installed packages (directories and modules) that pytest and the tests import.
	PYTHONPATH="$REPO/tests" $PY - "$site" "$copy/site" $TESTS <<-'EOF'
		import glob, importlib, os, shutil, sys
		site, dest, tests = sys.argv[1], sys.argv[2], sys.argv[3:]
		import pytest  # noqa: F401
		for t in tests:
		    importlib.import_module(os.path.basename(t)[:-3])
		files = [getattr(m, "__file__", None) or "" for m in list(sys.modules.values())]
		tops = {os.path.relpath(f, site).split(os.sep)[0] for f in files
		        if f.startswith(site + os.sep)}
		for top in sorted(tops):
		    for src in [os.path.join(site, top), *glob.glob(os.path.join(site, top + ".libs"))]:
		        to = os.path.join(dest, os.path.basename(src))
		        (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, to)
	EOF
	chmod -R a+rX "$copy"
	echo "sandbox_unprivileged: nobody cannot read $REPO or $site: using a copy in $copy"
	REPO=$copy
	site=$copy/site
fi
interp=""
for c in "$PY" "python$ver" "/usr/bin/python$ver" "/usr/local/bin/python$ver"; do
	if as_nobody PYTHONPATH="$REPO:$site" "$c" -c \
		"import sys, pytest; assert sys.version_info[:2] == ($vtuple), sys.version" 2>/dev/null; then
		interp=$(as_nobody "$c" -c "import sys; print(sys.executable)")  # as nobody finds it
		break
	fi
done
if [ -z "$interp" ]; then
	echo "sandbox_unprivileged: no python$ver that nobody can run (the venv's lives under" \
		"a directory nobody cannot enter); install python$ver system-wide" >&2
	exit 1
fi
# The throwaway venv, with pytest's import closure (as the harness runs it) in its
# site-packages; its prefix is what the sandbox mounts for the interpreter.
venv=$(mktemp -d "${TMPDIR:-/tmp}/locojax-nobody-venv.XXXXXX")
trap '[ -z "$copy" ] || rm -rf "$copy"; rm -rf "$venv"' EXIT
if ! "$interp" -m venv --without-pip "$venv/venv"; then
	echo "sandbox_unprivileged: $interp cannot make a venv (its venv module: on Debian," \
		"apt-get install python$ver-venv)" >&2
	exit 1
fi
vsite=$("$venv/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
PYTHONPATH="$site" PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$venv/venv/bin/python" - "$site" "$vsite" >/dev/null <<-'EOF'
	import os, shutil, sys, tempfile
	site, dest = sys.argv[1], sys.argv[2]
	import pytest
	with tempfile.TemporaryDirectory() as d:  # what running a test imports, not just pytest
	    with open(os.path.join(d, "test_x.py"), "w") as f:
	        f.write("def test_x():\n    assert 1\n")
	    pytest.main(["-q", "-p", "no:cacheprovider", "--noconftest", d])
	for m in list(sys.modules.values()):
	    f = getattr(m, "__file__", None) or ""
	    if f.startswith(site + os.sep):
	        top = os.path.relpath(f, site).split(os.sep)[0]
	        src, to = os.path.join(site, top), os.path.join(dest, top)
	        if not os.path.exists(to):
	            (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, to)
EOF
chmod -R a+rX "$venv"
interp=$venv/venv/bin/python
echo "sandbox_unprivileged: as nobody with $interp (a venv of $(readlink -f "$interp"))"
cd "$REPO"
status=0
setpriv --reuid=65534 --regid=65534 --clear-groups env -i HOME=/tmp \
	PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 PYTHONPATH="$REPO:$site" \
	"$interp" -m pytest -q -p no:cacheprovider --noconftest $TESTS "$@" ||
	status=$?
exit $status
