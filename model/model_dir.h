/* A sharded model directory (model_dir.c): its index read and checked
 * against its shards. Internal: pipeline/'s shard conversion uses it. */
#ifndef STZ_MODEL_DIR_H
#define STZ_MODEL_DIR_H

#include "stz_model.h"
#include "stz_pack.h"

struct cJSON;

typedef struct {
    const char *dir;     /* as given */
    char *real;          /* resolved */
    struct cJSON *index; /* the index, parsed */
    char **shards;       /* file names, in first-seen order */
    size_t n;
} stz_model_dir;

/* Reads the index of `dir`: an object without duplicate keys whose
 * weight_map maps tensor names to plain file names (stz_model_dir_free
 * after, on failure too). */
stz_status stz_model_dir_load(stz_model_dir *m, const char *dir, stz_err *err);
void stz_model_dir_free(stz_model_dir *m);
/* dir/SHARD+suffix into buf; 0, or -1 if it does not fit. */
int stz_shard_path(char *buf, size_t cap, const char *dir, const char *shard, const char *suffix);
/* Checks the shards (SHARD + suffix; suffix NULL: SHARD where it exists,
 * else SHARD.stz): present, not links out of the directory, and agreeing
 * with the index. */
stz_status stz_model_dir_check(const stz_model_dir *m, const char *suffix, stz_err *err);
/* The tensor names of a SafeTensors file or of a container's original:
 * *h is the header to read them from (one of *r, *c is opened; free both). */
stz_status stz_open_names(const char *path, stz_reader **r, stz_container **c, const stz_reader **h, stz_err *err);

#endif /* STZ_MODEL_DIR_H */
