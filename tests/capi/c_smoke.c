/* Compiled as C99 by test_capi (CApiLibrary.HeaderCompilesAsC99): the header needs no C++. */
#include <stdio.h>

#include "corelm/c_api.h"

int main(int argc, char** argv) {
  corelm_model* model = NULL;
  const char* prompts[1];
  char* out = NULL;
  corelm_status s;
  if (argc < 2) return 2;
  s = corelm_model_load(argv[1], NULL, &model);
  if (s != CORELM_OK) {
    fprintf(stderr, "%s\n", corelm_last_error());
    return 1;
  }
  prompts[0] = "the cat";
  s = corelm_generate(model, prompts, 1, "{\"max_tokens\": 8}", &out);
  if (s == CORELM_OK) printf("%s\n", out);
  corelm_string_free(out);
  corelm_model_free(model);
  return s == CORELM_OK ? 0 : 1;
}
