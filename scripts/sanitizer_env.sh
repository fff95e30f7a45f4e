# Sourced by scripts/test.sh and scripts/sanitize.sh: the sanitizer runtimes' options for every instrumented test.
# Reports go to stderr (ctest shows them with --output-on-failure) and fail the run: ASan and UBSan exit non-zero
# on the first report (UBSan does not recover), TSan halts on the first race; leaks fail at exit.
# SPDX-License-Identifier: MIT
export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
