# Kiln: staged as /mnt/data/.kiln/javac.sh; the `java` compile step runs it
# with bash, passing javac's JVM options (-J...) as arguments.
#
# The code arrives as Main.java whatever its class is called. javac insists
# that a public top-level class lives in a file of the same name, so a
# `public class HelloWorld` is compiled from a copy named HelloWorld.java.
# The class to run (the public one, else the first top-level class, else
# Main) is written to .kiln-build/main-class, which the run step hands to
# the java launcher as an @argfile.
set -euo pipefail
build=/mnt/data/.kiln-build
src=Main.java
mods='((final|abstract|sealed|non-sealed|strictfp|static)[[:space:]]+)*'
kind='(class|interface|enum|record)[[:space:]]+([A-Za-z_$][A-Za-z0-9_$]*)'
public=$(sed -n -E "s/^public[[:space:]]+${mods}${kind}.*/\\4/p" "$src" | head -n 1)
first=$(sed -n -E "s/^(public[[:space:]]+)?${mods}${kind}.*/\\5/p" "$src" | head -n 1)
main=${public:-${first:-Main}}
if [[ -n "$public" && "$public" != Main ]]; then
  mkdir -p "$build/src"
  cp "$src" "$build/src/$public.java"
  cd "$build/src"
  src="$public.java"
fi
mkdir -p "$build/classes"
javac "$@" -encoding UTF-8 -d "$build/classes" -sourcepath /mnt/data "$src"
printf '%s\n' "$main" >"$build/main-class"
