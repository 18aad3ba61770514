# Helpers that give every target the same warnings, include root and layering.
#
#   packsched_cc_library(NAME name SRCS ... [HDRS ...] [DEPS ...] [PUBLIC_DEPS ...])
#   packsched_cc_binary(NAME name SRCS ... [DEPS ...] [OUTPUT_NAME out])
#   packsched_cc_test(NAME name SRCS ... [DEPS ...] [LABELS ...] [TIMEOUT seconds])
#
# Libraries are static and named packsched_<name>, with the alias packsched::<name>. Include
# paths are rooted at the repository ("server/base/status.h").
#
# PUBLIC_DEPS are what the library's public headers include: its users compile against them.
# DEPS are what only its sources use: linked PRIVATE, so their headers, include paths and
# definitions stay inside (a static library still passes them on to the final link, as
# $<LINK_ONLY:...>). A header-only (INTERFACE) library passes both on.

# -Wno-missing-field-initializers: a C++20 designated initializer ({.sync = kStep}) leaves the
# other members at their default member initializers, which GCC 12 still reports.
set(PACKSCHED_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)

function(_packsched_common target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${PACKSCHED_WARNINGS}>)
endfunction()

function(packsched_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;HDRS;DEPS;PUBLIC_DEPS" ${ARGN})
  set(target packsched_${ARG_NAME})
  if(ARG_SRCS)
    add_library(${target} STATIC ${ARG_SRCS} ${ARG_HDRS})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${target} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_DEPS})
    _packsched_common(${target})
  else()
    add_library(${target} INTERFACE ${ARG_HDRS})
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${target} INTERFACE ${ARG_PUBLIC_DEPS} ${ARG_DEPS})
  endif()
  add_library(packsched::${ARG_NAME} ALIAS ${target})
endfunction()

function(packsched_cc_binary)
  cmake_parse_arguments(ARG "" "NAME;OUTPUT_NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  _packsched_common(${ARG_NAME})
  if(ARG_OUTPUT_NAME)
    set_target_properties(${ARG_NAME} PROPERTIES OUTPUT_NAME ${ARG_OUTPUT_NAME})
  endif()
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
endfunction()

function(packsched_cc_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  _packsched_common(${ARG_NAME})
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}")
endfunction()
