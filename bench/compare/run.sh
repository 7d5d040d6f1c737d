#!/usr/bin/env bash
# Runs the comparison benchmarks PASSES times (default 6) and writes them
# to OUT (default out.txt) for benchstat. The passes are interleaved (each
# pass runs every benchmark once), so that a change in the machine's load
# during the run hits every contender alike rather than one of them; the
# load average before each pass is written into OUT as a comment.
#
#   [BENCH=regexp] [BENCHTIME=1s] ./run.sh [PASSES [OUT]]
#   go run golang.org/x/perf/cmd/benchstat@latest out.txt
set -euo pipefail
cd "$(dirname "$0")"
passes=${1:-6}
out=${2:-out.txt}
bench=${BENCH:-.}
benchtime=${BENCHTIME:-1s}
bin=$(mktemp -d)/compare.test
go test -c -o "$bin" .
: >"$out"
for i in $(seq "$passes"); do
	echo "# pass $i of $passes, $(uptime)" | tee -a "$out"
	"$bin" -test.run '^$' -test.bench "$bench" -test.benchmem -test.benchtime "$benchtime" -test.count 1 | tee -a "$out"
done
echo "# done, $(uptime)" | tee -a "$out"
rm -r "$(dirname "$bin")"
