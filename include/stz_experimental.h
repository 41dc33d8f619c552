/*
 * stz_experimental.h - the gate of the headers whose API is not yet stable.
 *
 * stz.h, stz_safetensors.h, stz_quant.h, stz_policy.h, stz_pack.h,
 * stz_model.h, stz_pipeline.h and stz_eval.h are stable: what they declare
 * keeps its meaning within a major version. stz_forward.h, stz_tune.h,
 * stz_gguf.h, stz_export.h, stz_svd.h, stz_synth.h, stz_kernels.h,
 * stz_planes.h and stz_files.h may change in any release (the GGUF block types, importance
 * matrices and error feedback are reshaping them; the kernels follow the
 * formats);
 * a program that uses them says so by defining STZ_EXPERIMENTAL before it
 * includes them, as zstd's ZSTD_STATIC_LINKING_ONLY does. Their functions
 * are exported by libstz.so all the same.
 */
#ifndef STZ_EXPERIMENTAL_H
#define STZ_EXPERIMENTAL_H

#ifndef STZ_EXPERIMENTAL
#error                                                                                                                 \
    "this stz header is experimental (its API may change in any release): #define STZ_EXPERIMENTAL before including it"
#endif

#endif /* STZ_EXPERIMENTAL_H */
