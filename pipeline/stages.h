/* Progress in named stages (stz_stages, stz_pipeline.h) as the library's
 * long calls report it: a stage opened with its label, its step passed as
 * any stz_progress_fn with the stage as user, then closed. */
#ifndef STZ_PIPELINE_STAGES_H
#define STZ_PIPELINE_STAGES_H

#include "stz_pipeline.h"

/* A stage under way: its stz_stages and what their begin returned. */
typedef struct {
    const stz_stages *stages;
    void *state;
} stz_stage;

/* A stage begun (s NULL: shows nothing); quiet: not shown; items: it
 * counts items, not bytes. */
stz_stage stz_stage_open(const stz_stages *s, const char *label, int quiet, int items);
/* An stz_progress_fn whose user is a stz_stage *: non-zero stops (an
 * interrupt when s has no step). */
int stz_stage_step(void *user, uint64_t done, uint64_t total);
void stz_stage_close(stz_stage *g);

#endif
