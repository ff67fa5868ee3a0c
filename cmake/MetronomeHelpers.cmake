# Shared compile settings and the helpers every CMakeLists.txt in the tree uses.

set(METRONOME_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
    -Wimplicit-fallthrough)
if(METRONOME_WERROR)
  list(APPEND METRONOME_WARNINGS -Werror)
endif()

add_library(metronome_compile_options INTERFACE)
target_compile_options(metronome_compile_options INTERFACE ${METRONOME_WARNINGS})
if(METRONOME_ARCH)
  target_compile_options(metronome_compile_options INTERFACE -march=${METRONOME_ARCH})
endif()
if(METRONOME_SANITIZE)
  target_compile_options(metronome_compile_options INTERFACE
    -fsanitize=${METRONOME_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_link_options(metronome_compile_options INTERFACE -fsanitize=${METRONOME_SANITIZE})
endif()

# metronome_cc_library(NAME name SRCS ... DEPS ...): one library per module folder, includes rooted
# at src/.
function(metronome_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(metronome_${ARG_NAME} STATIC ${ARG_SRCS})
  add_library(metronome::${ARG_NAME} ALIAS metronome_${ARG_NAME})
  target_include_directories(metronome_${ARG_NAME} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(metronome_${ARG_NAME} PUBLIC metronome_compile_options ${ARG_DEPS})
endfunction()

# metronome_cc_test(NAME name SRCS ... DEPS ... [LABELS ...]): a GoogleTest binary registered with
# ctest; every test in it is discovered separately.
function(metronome_cc_test)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE metronome_compile_options ${ARG_DEPS} GTest::gtest
    GTest::gtest_main)
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${ARG_NAME} PRIVATE METRONOME_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  gtest_discover_tests(${ARG_NAME}
    PROPERTIES LABELS "${ARG_LABELS}"
               ENVIRONMENT "METRONOME_SHARED_DIR=${PROJECT_SOURCE_DIR}/../shared;OMP_NUM_THREADS=2"
    DISCOVERY_TIMEOUT 60)
endfunction()
