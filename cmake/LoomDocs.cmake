# LoomDocs.cmake - the man pages and the bash completion of the loom command,
# from the command itself (cmake -P at build time, cmake/LoomInstall.cmake):
#   OUT/man1/loom.1          loom --help-man
#   OUT/man1/loom-CMD.1      loom CMD --help-man (the tables --help prints)
#   OUT/completions/loom     commands, and each command's flags as --help lists them
#   -DLOOM=path/to/loom -DOUT=dir -DCOMMANDS="train;eval;..."
file(MAKE_DIRECTORY ${OUT}/man1 ${OUT}/completions)
# one rank, one thread, whatever launched the build
set(ENV{OMP_NUM_THREADS} 1)
# a sanitizer build (make test-asan) runs this too: its leak report is not what this step checks
set(ENV{ASAN_OPTIONS} "detect_leaks=0")
foreach(v OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK PMI_SIZE PMI_RANK PMIX_RANK SLURM_STEP_NUM_TASKS SLURM_PROCID)
  unset(ENV{${v}})
endforeach()

function(run_loom out)
  execute_process(COMMAND ${LOOM} ${ARGN} OUTPUT_VARIABLE text RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "loom ${ARGN} failed (${rc}): ${err}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

run_loom(man --help-man)
file(WRITE ${OUT}/man1/loom.1 "${man}")
set(cases "")
foreach(c ${COMMANDS})
  run_loom(man ${c} --help-man)
  file(WRITE ${OUT}/man1/loom-${c}.1 "${man}")
  run_loom(help ${c} --help)
  string(REGEX MATCHALL "\n  --[a-z0-9-]+" flags "${help}")
  string(REPLACE "\n  " "" flags "${flags}")
  string(REPLACE ";" " " flags "${flags}")
  string(APPEND cases "        ${c}) flags=\"${flags} --help\" ;;\n")
endforeach()
string(REPLACE ";" " " names "${COMMANDS}")
file(WRITE ${OUT}/completions/loom "# bash completion for loom - generated from `loom CMD --help` by cmake/LoomDocs.cmake
_loom() {
    local cur=\${COMP_WORDS[COMP_CWORD]} flags=\"\"
    if [ \"\$COMP_CWORD\" -eq 1 ]; then
        COMPREPLY=(\$(compgen -W \"${names} version --help --version\" -- \"\$cur\"))
        return 0
    fi
    case \${COMP_WORDS[1]} in
${cases}    esac
    if [[ \$cur == -* ]]; then
        COMPREPLY=(\$(compgen -W \"\$flags\" -- \"\$cur\"))
    else
        COMPREPLY=(\$(compgen -f -- \"\$cur\"))
    fi
    return 0
}
complete -o filenames -F _loom loom loom-cuda
")
