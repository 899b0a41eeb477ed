/* Entrypoint of the test image berth-test/envoy:exits-at-start: `envoy --mode validate`
 * works as usual, so the image passes berth's validation, but serving exits at once with an
 * error, like a broken release would. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--mode") == 0 && strcmp(argv[i + 1], "validate") == 0) {
            argv[0] = "/usr/local/bin/envoy";
            execv(argv[0], argv);
            perror("execv");
            return 127;
        }
    }
    fprintf(stderr, "[critical] berth-test: this image exits at start on purpose\n");
    return 1;
}
