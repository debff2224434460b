#!/usr/bin/env bash
# Runs CTest in a sanitizer build (build-asan/ or build-tsan/) with the project's sanitizer
# options, and fails when any instrumented process — a test, or a server that a Python test
# started — wrote a sanitizer report, whatever its caller made of its exit status.
#
#   tests/sanitizers/ctest.sh BUILD_DIR [ctest arguments...]
#
# Reports go to BUILD_DIR/sanitizer-reports/<sanitizer>.<pid> and are printed at the end.
# Suppressions (each with the reason) are in this folder: lsan.supp, tsan.supp.
set -euo pipefail

build="$(cd "${1:?usage: $0 BUILD_DIR [ctest arguments...]}" && pwd)"
shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
reports="$build/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"

export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:log_path=$reports/asan"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:log_path=$reports/tsan:suppressions=$here/tsan.supp"
# Which sanitizer the build carries, for tests that repeat a scenario only to catch a rare timing
# (tests/python/test_shutdown.py runs each twice under a sanitizer).
PROBE_SIDECAR_SANITIZER="$(sed -n 's/^PROBESIDECAR_SANITIZE:STRING=//p' "$build/CMakeCache.txt")"
export PROBE_SIDECAR_SANITIZER="${PROBE_SIDECAR_SANITIZER:-unknown}"

status=0
ctest --test-dir "$build" --output-on-failure --timeout 900 "$@" || status=$?
if compgen -G "$reports/*" >/dev/null; then
  echo "== sanitizer reports (in $reports):"
  for report in "$reports"/*; do
    echo "---- $report"
    cat "$report"
  done
  status=1
fi
exit "$status"
