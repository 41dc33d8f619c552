/* Progress in named stages: the caller's stz_stages, or none. */
#include "stages.h"
#include "core/stz_core.h"

stz_stage stz_stage_open(const stz_stages *s, const char *label, int quiet, int items)
{
    int flags = (quiet ? STZ_STAGE_QUIET : 0) | (items ? STZ_STAGE_ITEMS : 0);
    stz_stage g = {s, s && s->begin ? s->begin(s->user, label, flags) : NULL};
    return g;
}

int stz_stage_step(void *user, uint64_t done, uint64_t total)
{
    const stz_stage *g = (const stz_stage *)user;
    return g && g->stages && g->stages->step ? g->stages->step(g->state, done, total) : stz_interrupt_pending();
}

void stz_stage_close(stz_stage *g)
{
    if (g->stages && g->stages->end)
        g->stages->end(g->state);
}
