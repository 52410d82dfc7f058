#!/bin/bash
# The shared library exports exactly the functions include/mha.h declares
# with MHA_API: no kernel, engine internal or test hook (docs/design.md,
# "The house"). Usage: check_abi.sh LIBMHA_SO MHA_H
so=$1 header=$2
exported=$(nm -D --defined-only "$so" | awk '$2 == "T" || $2 == "D" || $2 == "R" || $2 == "B" { print $3 }' | sort)
declared=$(grep -v '#define' "$header" | grep -o 'MHA_API[^(]*(' | sed 's/($//; s/.*[ *]//' | sort)
if [ "$exported" = "$declared" ]; then
    echo "ABI: $(echo "$exported" | wc -l) exported symbols, all declared in mha.h"
    exit 0
fi
echo "exported but not declared:"; comm -23 <(echo "$exported") <(echo "$declared") 2>/dev/null || echo "$exported"
echo "declared but not exported:"; comm -13 <(echo "$exported") <(echo "$declared") 2>/dev/null || echo "$declared"
exit 1
