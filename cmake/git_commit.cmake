# cmake -DSOURCE_DIR=... -DOUT=... -P git_commit.cmake: writes OUT, a header defining CM_GIT_COMMIT
# as the source tree's commit ("unknown" outside git), and rewrites it only when the commit
# changed, so only the file that includes it recompiles, and only then. Run at every build.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT commit)
  set(commit "unknown")
endif()
file(CONFIGURE OUTPUT ${OUT}
     CONTENT "/* generated at build time by cmake/git_commit.cmake: the commit the library is built from */\n#define CM_GIT_COMMIT \"${commit}\"\n")
