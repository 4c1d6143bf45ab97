# Turns a text file into a C++ source defining `std::string_view NAME()` that returns its
# contents, so sqbox ships it inside its one binary. Usage:
#   cmake -DINPUT=file -DOUTPUT=file.cpp -DNAME=function -DHEADER=include/path.h -P embed_text.cmake
file(READ "${INPUT}" content)
string(FIND "${content}" ")sqbox_embedded\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/embed_text.cmake; do not edit.\n"
  "#include \"${HEADER}\"\n\n"
  "namespace sqbox {\n\n"
  "std::string_view ${NAME}() {\n"
  "    static constexpr const char kText[] = R\"sqbox_embedded(${content})sqbox_embedded\";\n"
  "    return {kText, sizeof kText - 1};\n"
  "}\n\n"
  "}  // namespace sqbox\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
