/* Runs a fuzz target without a fuzzing engine: every file of the given
 * directories, plus seeded mutations of each (bit flips, byte changes,
 * truncations, length-field edits), so CTest exercises the parser on
 * thousands of near-valid inputs. Usage: fuzz_replay [-n MUTATIONS] DIR... */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng = 0x5eed;
static uint64_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static void mutate_and_run(const uint8_t *seed, size_t n, int count)
{
    uint8_t *b = malloc(n + 16);
    for (int k = 0; k < count; k++) {
        memcpy(b, seed, n);
        size_t len = n;
        switch (next() % 5) {
        case 0:
            if (n)
                b[next() % n] ^= (uint8_t)(1u << (next() % 8));
            break;
        case 1:
            if (n)
                b[next() % n] = (uint8_t)next();
            break;
        case 2: len = n ? next() % n : 0; break;
        case 3:
            if (n >= 8)
                b[next() % 8] = (uint8_t)next();
            break; /* header length */
        case 4:    /* digits: shake numbers in the JSON */
            for (size_t i = 8; i < n; i++)
                if (b[i] >= '0' && b[i] <= '9' && next() % 8 == 0)
                    b[i] = (uint8_t)('0' + next() % 10);
            break;
        }
        LLVMFuzzerTestOneInput(b, len);
    }
    free(b);
}

int main(int argc, char **argv)
{
    int mutations = 300, files = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            mutations = atoi(argv[++i]);
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) {
            fprintf(stderr, "fuzz_replay: cannot open %s\n", argv[i]);
            return 1;
        }
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            FILE *f = fopen(path, "rb");
            if (!f)
                continue;
            fseek(f, 0, SEEK_END);
            long sz = ftell(f);
            fseek(f, 0, SEEK_SET);
            uint8_t *buf = malloc((size_t)sz + 1);
            size_t n = fread(buf, 1, (size_t)sz, f);
            fclose(f);
            LLVMFuzzerTestOneInput(buf, n);
            mutate_and_run(buf, n, mutations);
            free(buf);
            files++;
        }
        closedir(d);
    }
    printf("fuzz_replay: %d files, %d mutations each: no crash\n", files, mutations);
    return files ? 0 : 1;
}
