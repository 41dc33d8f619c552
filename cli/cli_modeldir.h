/* Model directories as the CLI sees them (cli_modeldir.c): a sharded
 * directory's index and shards, checked; copying what is not a shard.
 * CLI-internal. */
#ifndef CLI_MODELDIR_H
#define CLI_MODELDIR_H

#include "cli.h"
#include "stz_pack.h"
#include "stz_safetensors.h"

#include <cjson/cJSON.h>

#define INDEX_NAME "model.safetensors.index.json"

typedef struct {
    char *dir, *real; /* as given, and resolved */
    cJSON *index;
    char **shards; /* file names, in first-seen order */
    size_t n;
} cli_model_dir;

/* dir/name into buf; 0, or -1 if it does not fit. */
int cli_pjoin(char *buf, size_t cap, const char *dir, const char *name);
void cli_model_dir_free(cli_model_dir *m);
/* Reads the index of `dir` and lists its shards (cli_model_dir_free after). */
stz_status cli_model_dir_load(cli_model_dir *m, const char *dir, stz_err *err);
/* Checks the shards (SHARD + suffix): present, not links out of the
 * directory, and agreeing with the index. */
stz_status cli_model_dir_check(const cli_model_dir *m, const char *suffix, stz_err *err);
/* The tensor names of a SafeTensors file or of a container's original. */
stz_status cli_open_names(const char *path, stz_reader **r, stz_container **c, const stz_reader **h, stz_err *err);
stz_status cli_copy_file(const char *from, const char *to, stz_err *err);
/* Copies everything below `from` into `to` except `skip` (NULL-terminated
 * top-level names); links inside the model directory `root` stay links. */
stz_status cli_copy_tree(const char *root, const char *from, const char *to, char *const *skip, stz_err *err);

#endif /* CLI_MODELDIR_H */
