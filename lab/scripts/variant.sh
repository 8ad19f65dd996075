# Sourced by lab/scripts/ab.sh and lab/scripts/trace-ab.sh: `parse_variant SPEC BUILD` splits a variant
# spec "name[:ENV=v,ENV2=w][+--flag+--flag2]" into $name, $envs ("ENV=v ENV2=w"), $args
# ("--flag --flag2"), $label (for the output) and $bin: exp/<name>/tools/loom when that exists,
# else BUILD/tools/loom (so a name can also just label a switch).
parse_variant() {
  local v=$1
  args=""
  [[ "$v" == *+* ]] && args=${v#*+} && v=${v%%+*}
  name=${v%%:*} envs=""
  [[ "$v" == *:* ]] && envs=${v#*:}
  envs=${envs//,/ } args=${args//+/ }
  label="$name${envs:+ ($envs)}${args:+ [$args]}"
  bin=$2/tools/loom
  [ -x "exp/$name/tools/loom" ] && bin=exp/$name/tools/loom
  return 0
}
