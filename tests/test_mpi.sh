#!/bin/sh
# stz under mpirun (2 ranks on this machine): a sharded model compressed,
# decompressed and verified by two processes gives exactly the single
# process's output; a failing rank fails the job and leaves no directory.
# Skips (77) when stz was built without MPI or mpirun is missing.
# Usage: test_mpi.sh STZ
set -u
. "$(dirname "$0")/cli_lib.sh"
if ! command -v mpirun >/dev/null || ! ldd "$STZ" 2>/dev/null | grep -q libmpi; then
    echo "mpi: skipped (stz built without MPI, or no mpirun)"
    exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_orte_tmpdir_base="$T" # its own session directory: another mpirun at the same time cannot collide
MPI="mpirun -n 2"
"$STZ" synth tiny --layers 6 --shards 3 -o "$T/m" -q
for mode in --int4 --lossless; do
    "$STZ" compress $mode "$T/m" -o "$T/one$mode" -q
    expect_rc 0 "mpirun compress $mode" $MPI "$STZ" compress $mode "$T/m" -o "$T/two$mode"
    diff -r "$T/one$mode" "$T/two$mode" >/dev/null && ok || bad "compress $mode: 2 ranks differ from 1"
    [ "$(grep -c " -> " "$T/out")" = 1 ] && ok || bad "compress $mode: one summary (rank 0's) expected"
    has "$T/out" "3 shards\|sharded" "the summary covers every shard"
    "$STZ" decompress "$T/one$mode" -o "$T/done$mode" -q
    expect_rc 0 "mpirun decompress $mode" $MPI "$STZ" decompress "$T/two$mode" -o "$T/dtwo$mode"
    diff -r "$T/done$mode" "$T/dtwo$mode" >/dev/null && ok || bad "decompress $mode: 2 ranks differ from 1"
    expect_rc 0 "mpirun verify $mode" $MPI "$STZ" verify "$T/two$mode"
    [ "$(grep -c "OK\|ok" "$T/out")" -ge 3 ] && ok || bad "verify: every shard checked once"
done
"$STZ" compress --int4 "$T/m" -o "$T/ref" -q --json >"$T/ref.json"
$MPI "$STZ" compress --int4 "$T/m" -o "$T/two.json.d" -q --json >"$T/two.json"
grep -v '"seconds"\|"output"' "$T/ref.json" >"$T/a" && grep -v '"seconds"\|"output"' "$T/two.json" >"$T/b"
same "$T/a" "$T/b" "the --json summary gathers every rank's figures"
# a damaged shard, whichever rank has it: the job fails with its error, no directory is left
for k in 1 2 3; do
    rm -rf "$T/bad" && cp -r "$T/two--lossless" "$T/bad"
    f=$(ls "$T/bad"/*.stz | sed -n "${k}p")
    printf 'XXXXXXXX' | dd of="$f" bs=1 seek=2000 conv=notrunc 2>/dev/null
    expect_rc 1 "mpirun decompress with shard $k damaged" $MPI "$STZ" decompress "$T/bad" -o "$T/bad.out"
    has "$T/err" "$(basename "$f")" "the failing shard named"
    [ -e "$T/bad.out" ] && bad "a failed job left its output" || ok
    [ -z "$(ls -A "$T" | grep '^\.bad\.out\.tmp')" ] && ok || bad "a failed job left a temporary directory"
    expect_rc 1 "mpirun verify with shard $k damaged" $MPI "$STZ" verify "$T/bad"
done
expect_rc 2 "mpirun with a single file" $MPI "$STZ" compress --int4 "$T/m/$(ls "$T/m" | grep safetensors$ | head -1)" -o "$T/x.stz"
expect_rc 2 "mpirun with another command" $MPI "$STZ" inspect "$T/m"
finish mpi
