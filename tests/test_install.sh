#!/bin/sh
# Installs the build into a scratch prefix and builds a small C program
# against it with pkg-config, shared and static; runs both.
# Usage: test_install.sh BUILD_DIR [SHARED_DATA_DIR]
set -u
BUILD=$1
. "$(dirname "$0")/cli_lib.sh" "$BUILD/stz"
P=$T/prefix
if ! command -v pkg-config >/dev/null || ! command -v cc >/dev/null; then
    echo "skip: pkg-config or cc missing"
    exit 77
fi
cmake --install "$BUILD" --prefix "$P" >"$T/install.log" 2>&1 && ok || { bad "cmake --install"; cat "$T/install.log"; }
for f in bin/stz include/stz.h include/stz_quant.h include/stz_forward.h share/doc/stz/LICENSE share/doc/stz/FORMAT.md; do
    [ -e "$P/$f" ] && ok || bad "installed $f"
done
LIB=$(ls -d "$P"/lib*/libstz.so.0 2>/dev/null | head -1)
[ -n "$LIB" ] && ok || bad "libstz.so.0 (versioned SONAME) installed"
objdump -p "$LIB" 2>/dev/null | grep -q "SONAME *libstz.so.0" && ok || bad "SONAME is libstz.so.0"
# no empty or relative RUNPATH/RPATH entry (the loader would search the current directory: issue 52)
for f in "$P/bin/stz" "$LIB"; do
    if objdump -p "$f" 2>/dev/null | awk '$1 == "RUNPATH" || $1 == "RPATH" { print $2 }' | grep -Eq '(^|:)(:|$)|(^|:)[^/:$]'; then
        bad "$f: an empty or relative RUNPATH entry: $(objdump -p "$f" | grep PATH)"
    else
        ok
    fi
done
PCDIR=$(dirname "$LIB")/pkgconfig
cat >"$T/prog.c" <<'C'
#include <stdio.h>
#define STZ_EXPERIMENTAL /* stz_synth.h */
#include "stz.h"
#include "stz_pipeline.h"
#include "stz_safetensors.h"
#include "stz_synth.h"

int main(int argc, char **argv)
{
    stz_synth_params p = STZ_SYNTH_PARAMS_DEFAULT;
    stz_quant_params qp = STZ_QUANT_PARAMS_DEFAULT;
    stz_pack_params pp = STZ_PACK_PARAMS_DEFAULT;
    stz_pack_stats ps;
    stz_err err;
    stz_reader *r;
    stz_policy *pol;
    char out[4096];
    snprintf(out, sizeof out, "%s.stz", argc > 1 ? argv[1] : "");
    if (argc < 2 || stz_synth_write(&p, argv[1], NULL, &err) || stz_reader_open(&r, argv[1], &err) ||
        stz_policy_load(&pol, "int4", &err) || stz_compress_file(&qp, &pp, pol, argv[1], out, NULL, &ps, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("%zu tensors\n%llu bytes packed\n", stz_reader_count(r), (unsigned long long)ps.out_bytes);
    stz_reader_free(r);
    stz_policy_free(pol);
    return 0;
}
C
export PKG_CONFIG_PATH=$PCDIR
# shared: nothing but what pkg-config says
if cc "$T/prog.c" -o "$T/prog" $(pkg-config --cflags --libs stz) 2>"$T/cc.log"; then ok; else bad "cc with pkg-config --libs stz"; cat "$T/cc.log"; fi
expect_rc 0 "run against the installed libstz.so" env LD_LIBRARY_PATH="$(dirname "$LIB")" "$T/prog" "$T/m.safetensors"
has "$T/out" "^27 tensors$" "the program works"
"$P/bin/stz" compress --int4 --fast "$T/m.safetensors" -o "$T/cli.stz" -q
[ "$(wc -c <"$T/cli.stz") bytes packed" = "$(tail -1 "$T/out")" ] && ok || bad "stz_compress_file's container differs from stz compress's"
cmp -s "$T/cli.stz" "$T/m.safetensors.stz" && ok || bad "stz_compress_file = stz compress"
# static: the private dependencies come from pkg-config --static
if cc "$T/prog.c" -o "$T/prog.static" $(pkg-config --cflags stz) "$(dirname "$LIB")/libstz.a" \
    $(pkg-config --static --libs-only-L --libs-only-l stz | sed 's/-lstz//') 2>"$T/cc.log"; then ok; else bad "static link"; cat "$T/cc.log"; fi
expect_rc 0 "run the static program" "$T/prog.static" "$T/m2.safetensors"
expect_rc 0 "the installed stz runs" "$P/bin/stz" inspect "$T/m.safetensors"
finish install
