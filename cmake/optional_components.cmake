# Extra system libraries of components (included right after the component libraries exist).
# Tokenizer: SentencePiece .model files, .zst-compressed tokenizer files, and ICU for Unicode
# character classes + NFC (all Debian packages, see scripts/setup).
if(TARGET corelm_tokenizer)
  find_package(ICU REQUIRED COMPONENTS uc data)
  find_library(CORELM_SENTENCEPIECE_LIB sentencepiece REQUIRED)
  find_library(CORELM_ZSTD_LIB zstd REQUIRED)
  target_link_libraries(corelm_tokenizer PUBLIC ${CORELM_SENTENCEPIECE_LIB} ${CORELM_ZSTD_LIB} ICU::uc ICU::data)
endif()
