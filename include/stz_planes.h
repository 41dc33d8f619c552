/*
 * stz_planes.h - the container's plane kernels: the byte and bit-plane
 * split of a dtype's elements and its inverse, the reference form the
 * packer's fast paths are checked against. Experimental: for tests and
 * benchmarks; a program packs files through stz_pack.h.
 */
#ifndef STZ_PLANES_H
#define STZ_PLANES_H

#include "stz_experimental.h"
#include "stz_pack.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Transform used for a dtype. */
STZ_API stz_xform stz_xform_for_dtype(stz_dtype d);
/* Element width in bytes and plane count of a transform (0 for
 * STZ_XFORM_GGML, whose planes depend on the block type and the chunk's
 * start, and which these split and merge functions do not do). */
STZ_API unsigned stz_xform_width(stz_xform x);
STZ_API unsigned stz_xform_planes(stz_xform x);
/* Splits n bytes (a multiple of the width) into planes; plane k gets
 * n / width bytes at planes[k]. Reference implementation, no allocation. */
STZ_API void stz_xform_split(stz_xform x, const uint8_t *src, size_t n, uint8_t *const *planes);
/* Inverse of stz_xform_split. */
STZ_API void stz_xform_merge(stz_xform x, const uint8_t *const *planes, size_t n, uint8_t *dst);

#ifdef __cplusplus
}
#endif
#endif /* STZ_PLANES_H */
