#!/usr/bin/env bash
# Fetches real Apache Kafka client software from Maven Central, caches it, and exposes it for tests
# (called by `make kafka-tools`, and by `make setup` with --optional):
#   kafka:  Apache Kafka's command-line tools (the classes behind bin/kafka-*.sh, which Maven Central
#           has as jars, not as the release tarball) with their runtime dependencies, in
#           $cache/<KAFKA_VERSION>/lib, and wrappers in .tools/bin: kafka-topics,
#           kafka-console-producer, kafka-console-consumer, kafka-consumer-groups,
#           kafka-delete-records, kafka-acls, kafka-configs (the last from the Scala core jar kafka_2.13),
#           kafka-verifiable-producer, kafka-producer-perf-test, kafka-transactions,
#           kafka-leader-election and kafka-reassign-partitions.
#           Logs go to stderr at WARN, so stdout carries only the tool's output.
#   newest: the same tools at KAFKA_NEWEST_VERSION, the newest Kafka 4.x Maven Central serves,
#           in $cache/<KAFKA_NEWEST_VERSION>/lib, wrappers in .tools/bin-newest and the manifest
#           .tools/kafka-tools-newest.json: the tests run Kafka's Java clients of both versions.
#   spark:  Spark's Kafka connector (spark-sql-kafka-0-10) for the PySpark installed in .venv, with
#           those of its runtime dependencies that PySpark does not ship, in
#           $cache/spark-kafka-<pyspark version>/, listed in jars.txt there (comma-separated absolute
#           paths, ready for spark.jars).
# Idempotent: nothing is fetched when the cache has it (a .complete stamp, written after checks,
# holding the list of artifacts fetched: a cache made for a shorter list is fetched again).
# Each fresh fetch is verified: every wrapper prints its version and usage, and a local-mode Spark
# session resolves the "kafka" data source up to needing a broker.
#
# usage: scripts/kafka_tools.sh [--kafka] [--newest] [--spark] [--check] [--force] [--optional]
#          (none of --kafka/--newest/--spark: all three)  --check: verify again even if cached;  --force: fetch again;
#          --optional: a failure is a warning, exit 0 (unless CI=true), as `make setup` wants.
# env:   LOWTIDE_KAFKA_TOOLS_CACHE (default ~/.cache/lowtide-kafka-tools); KAFKA_VERSION (default
#        below); SPARK_KAFKA_VERSION (default: PySpark's own version, see spark_connector_version;
#        a new value needs --force, the cache is per PySpark version);
#        PYTHON (default .venv/bin/python); LOWTIDE_MAVEN_REPO (Maven's local repository, default
#        ~/.m2/repository); LOWTIDE_MAVEN_ARGS (extra mvn arguments, e.g. -o).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=$root/.tools/bin
cache=${LOWTIDE_KAFKA_TOOLS_CACHE:-${HOME:-$root/.tools}/.cache/lowtide-kafka-tools}
# The newest 4.1.x release of org.apache.kafka:kafka-tools on Maven Central when this was written
# (4.1.0, 4.1.1, 4.1.2). Pinned, so that a cached copy is used without asking the network.
KAFKA_VERSION=${KAFKA_VERSION:-4.1.2}
# The newest Kafka 4.x release of kafka-tools and kafka_2.13 Maven Central served when this was
# written (2026-12-03: 4.4.0): Kafka 4 clients at their newest, next to the 4.1 ones (issue 50).
KAFKA_NEWEST_VERSION=${KAFKA_NEWEST_VERSION:-4.4.0}
manifest=$root/.tools/kafka-tools.json
# Kafka 4.1.2's own log4j-core version; log4j-slf4j-impl (Kafka's slf4j 1.7 binding, which its
# distribution ships in libs/ but kafka-tools' pom does not name) is added at the same version.
LOG4J_VERSION=${LOG4J_VERSION:-2.25.3}
PYTHON=${PYTHON:-$root/.venv/bin/python}
m2=${LOWTIDE_MAVEN_REPO:-${HOME:-$root/.tools}/.m2/repository}   # Maven's local repository
DEP_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1

# wrapper name -> main class (checked in the kafka-tools jar of 4.1.2 with unzip -l / javap)
declare -A KAFKA_TOOLS=(
  [kafka-topics]=org.apache.kafka.tools.TopicCommand
  [kafka-console-producer]=org.apache.kafka.tools.ConsoleProducer
  [kafka-console-consumer]=org.apache.kafka.tools.consumer.ConsoleConsumer
  [kafka-consumer-groups]=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
  [kafka-delete-records]=org.apache.kafka.tools.DeleteRecordsCommand
  [kafka-acls]=org.apache.kafka.tools.AclCommand
  # ConfigCommand was not moved to kafka-tools: it is in the Scala core jar (kafka_2.13)
  [kafka-configs]=kafka.admin.ConfigCommand
  # Kafka's system-test producer and its producer benchmark (bin/kafka-verifiable-producer.sh,
  # bin/kafka-producer-perf-test.sh): argparse4j tools, see KAFKA_USAGE_ON_STDOUT
  [kafka-verifiable-producer]=org.apache.kafka.tools.VerifiableProducer
  [kafka-producer-perf-test]=org.apache.kafka.tools.ProducerPerformance
  # KIP-664's transaction tool (bin/kafka-transactions.sh): argparse4j too
  [kafka-transactions]=org.apache.kafka.tools.TransactionsCommand
  # KIP-460's preferred/unclean elections and KIP-455's reassignment tool
  [kafka-leader-election]=org.apache.kafka.tools.LeaderElectionCommand
  [kafka-reassign-partitions]=org.apache.kafka.tools.reassign.ReassignPartitionsCommand
)
# first line of each tool's usage (printed by --help, on stderr, exit 1 as Kafka's own scripts do)
declare -A KAFKA_USAGE=(
  [kafka-topics]="This tool helps to create, delete, describe, or change a topic."
  [kafka-console-producer]="This tool helps to read data from standard input and publish it to Kafka."
  [kafka-console-consumer]="This tool helps to read data from Kafka topics and outputs it to standard output."
  [kafka-consumer-groups]="This tool helps to list"  # "... all consumer groups" (4.1), "..., describe," (4.4)
  [kafka-delete-records]="This tool helps to delete records of the given partitions"
  [kafka-acls]="This tool helps to manage acls on kafka."
  [kafka-configs]="This tool helps to manipulate and describe entity config for a topic, client, user, broker"
  [kafka-verifiable-producer]="usage: verifiable-producer"
  [kafka-producer-perf-test]="usage: "  # "producer-performance" (4.1), "kafka-producer-perf-test" (4.4)
  [kafka-transactions]="usage: kafka-transactions.sh"
  [kafka-leader-election]="This tool attempts to elect a new leader for a set of topic partitions."
  [kafka-reassign-partitions]="This tool helps to move topic partitions between replicas."
)
# Tools built on argparse4j, as Kafka ships them: --help prints the usage on stdout (exit 1), and
# there is no --version (TransactionsCommand's prints "<version> (Commit:<id>)"). They are checked
# by their usage alone.
declare -A KAFKA_USAGE_ON_STDOUT=([kafka-verifiable-producer]=1 [kafka-producer-perf-test]=1
                                  [kafka-transactions]=1)
# What the Kafka cache holds (group:artifact, at KAFKA_VERSION, with their runtime dependencies).
# Written into the .complete stamp: an older cache (stamp empty or listing less) is fetched again.
KAFKA_ARTIFACTS="org.apache.kafka:kafka-tools org.apache.kafka:kafka_2.13"

do_kafka=0 do_newest=0 do_spark=0 check=0 force=0 optional=0
for arg in "$@"; do
  case $arg in
    --kafka) do_kafka=1 ;;
    --newest) do_newest=1 ;;
    --spark) do_spark=1 ;;
    --check) check=1 ;;
    --force) force=1 ;;
    --optional) optional=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 0 ;;  # the header comment
    *) echo "kafka_tools.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
[ $do_kafka -eq 0 ] && [ $do_newest -eq 0 ] && [ $do_spark -eq 0 ] && do_kafka=1 do_newest=1 do_spark=1

say() { echo "kafka-tools: $*"; }
err() { echo "kafka-tools: ERROR: $*" >&2; }
# fail MESSAGE...: with --optional (and not CI) a warning and exit 0, else exit 1.
fail() {
  local line
  for line in "$@"; do err "$line"; done
  if [ $optional -eq 1 ] && [ "${CI:-}" != true ]; then
    echo "kafka-tools: WARNING: continuing without them: tests that need them skip ('make kafka-tools' retries)" >&2
    exit 0
  fi
  exit 1
}

java_major() {  # prints the major version of the java that the wrappers run, or 0
  local v
  v=$("${JAVA_HOME:+$JAVA_HOME/bin/}java" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}') || true
  case $v in
    1.*) v=${v#1.}; echo "${v%%.*}" ;;
    "") echo 0 ;;
    *) v=${v%%.*}; v=${v%%[!0-9]*}; echo "${v:-0}" ;;
  esac
}

require_java_mvn() {  # what a fetch needs; names what is missing
  local jv missing=()
  jv=$(java_major)
  [ "$jv" -ge 17 ] || missing+=("java >= 17 (found: $( [ "$jv" -eq 0 ] && echo none || echo "$jv"); apt-get install openjdk-17-jre-headless)")
  command -v mvn >/dev/null 2>&1 || missing+=("mvn (Apache Maven; apt-get install maven)")
  [ ${#missing[@]} -eq 0 ] || fail "cannot fetch from Maven Central: missing ${missing[*]}" \
    "(make setup installs both when run as root)"
}

work=""
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() { [ -n "$work" ] && rm -rf "$work"; return 0; }
trap cleanup EXIT
mkdir -p "$cache"
work=$(mktemp -d "$cache/.work.XXXXXX")
mvn_log=$work/mvn.log

# mvn ARGS...: batch mode, output to $mvn_log; on failure says why (artifact missing, network).
mvn_run() {
  local -a extra=()
  # shellcheck disable=SC2206  # LOWTIDE_MAVEN_ARGS is a list of words by design
  [ -n "${LOWTIDE_MAVEN_ARGS:-}" ] && extra=($LOWTIDE_MAVEN_ARGS)
  echo "+ mvn $*" >>"$mvn_log"
  mvn -B -ntp -Dstyle.color=never "-Dmaven.repo.local=$m2" "${extra[@]}" "$@" >>"$mvn_log" 2>&1
}
mvn_failure() {  # $1: what was being fetched
  if grep -qiE 'UnknownHost|Connection refused|Connect to .* failed|timed out|Network is unreachable|No route to host|Could not transfer' "$mvn_log"; then
    fail "fetching $1 failed: the network or Maven Central is not reachable (proxy or mirror in ~/.m2/settings.xml?)" \
      "last mvn lines:" "$(grep -E 'ERROR' "$mvn_log" | head -n 3)"
  elif grep -q 'Could not find artifact\|could not be resolved\|was not found in' "$mvn_log"; then
    fail "fetching $1 failed: an artifact is not on Maven Central:" "$(grep -E 'ERROR' "$mvn_log" | head -n 3)"
  else
    fail "fetching $1 failed; last lines of the mvn output:" "$(tail -n 15 "$mvn_log")"
  fi
}

# write_pom DIR DEPENDENCIES_XML [DEPENDENCY_MANAGEMENT_XML]
write_pom() {
  mkdir -p "$1"
  cat >"$1/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <!-- generated by scripts/kafka_tools.sh: only used to resolve and copy jars -->
  <modelVersion>4.0.0</modelVersion>
  <groupId>lowtide.local</groupId>
  <artifactId>kafka-tools-fetch</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencyManagement><dependencies>${3:-}</dependencies></dependencyManagement>
  <dependencies>$2</dependencies>
</project>
EOF
}
dep() { echo "<dependency><groupId>$1</groupId><artifactId>$2</artifactId><version>$3</version>${4:-}</dependency>"; }

# write_if_changed FILE MODE: stdin to FILE unless identical; returns 0 when it wrote.
write_if_changed() {
  local tmp=$1.tmp.$$
  cat >"$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; return 1; fi
  chmod "$2" "$tmp" && mv -f "$tmp" "$1"
}

# ---- (1) Kafka's command-line tools ---------------------------------------------------------
write_wrapper() {  # NAME MAINCLASS LIB LOG4J_CONFIG; returns 0 when the wrapper changed
  write_if_changed "$bin_dir/$1" 755 <<EOF
#!/usr/bin/env bash
# $1: Apache Kafka $KAFKA_VERSION's $2, generated by scripts/kafka_tools.sh (make kafka-tools)
# from the Maven Central jars in $3.
# Like Kafka's bin/$1.sh: JAVA_HOME, KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS, KAFKA_OPTS and
# KAFKA_LOG4J_OPTS are honoured; by default logs go to stderr at WARN (stdout: the tool's output).
set -euo pipefail
lib=$(printf %q "$3")
log4j=$(printf %q "$4")
[ -d "\$lib" ] || { echo "$1: Kafka's jars are missing (\$lib): run 'make kafka-tools'" >&2; exit 127; }
opts=()
read -ra opts <<<"\${KAFKA_HEAP_OPTS:--Xmx256M} \${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseSerialGC -XX:TieredStopAtLevel=1} \${KAFKA_OPTS:-}"
if [ -n "\${KAFKA_LOG4J_OPTS:-}" ]; then
  read -ra log_opts <<<"\$KAFKA_LOG4J_OPTS"
else
  log_opts=("-Dlog4j2.configurationFile=\$log4j")
fi
# The class archive of these jars (see build_class_archive in scripts/kafka_tools.sh), when made;
# the JVM's own warnings (a stale archive...) go to stderr, never into the tool's output.
cds=()
[ -r "\$lib.jsa" ] && cds=("-XX:SharedArchiveFile=\$lib.jsa" -Xlog:disable -Xlog:all=warning:stderr)
exec "\${JAVA_HOME:+\$JAVA_HOME/bin/}java" "\${opts[@]}" "\${cds[@]}" "\${log_opts[@]}" -cp "\$lib/*" $2 "\$@"
EOF
}

# ---- class data sharing -----------------------------------------------------------------------
# A Kafka tool's JVM spends most of its CPU loading and verifying the same classes on every run
# (1.5 CPU-s for a kafka-topics --describe); the test suite starts a few hundred. A CDS archive of
# the classes every tool shares (the admin client, network and protocol classes, log4j), made
# once per cache by the java the wrappers run (JDK 13+'s -XX:ArchiveClassesAtExit, from one admin
# tool run against a closed port), halves that: the JVM maps them instead. It sits beside the jars
# as lib.jsa, where the wrappers and tests/kafka_tools.py's java_command look for it; the JVM checks
# it against its own build and the class path and ignores it (a warning) when they differ.
build_class_archive() {  # LIB LOG4J
  local lib=$1 log4j=$2 java_id cfg=$work/closed.properties
  local java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
  java_id=$("$java" -version 2>&1 | tr '\n' ' ')
  if [ -s "$lib.jsa" ] && [ "$(cat "$lib.jsa.java" 2>/dev/null)" = "$java_id" ] && [ $force -eq 0 ]; then
    return 0
  fi
  printf 'default.api.timeout.ms=1500\nrequest.timeout.ms=1000\n' >"$cfg"
  rm -f "$lib.jsa" "$lib.jsa.tmp"
  timeout 120 "$java" "-XX:ArchiveClassesAtExit=$lib.jsa.tmp" -Xlog:disable -Xlog:all=error:stderr -Xmx256M \
    -XX:+UseSerialGC -XX:TieredStopAtLevel=1 "-Dlog4j2.configurationFile=$log4j" -cp "$lib/*" \
    org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:1 --list --command-config "$cfg" \
    >/dev/null 2>"$work/cds.err" || true  # it fails (nobody listens): the classes are what it is run for
  if [ -s "$lib.jsa.tmp" ]; then
    mv -f "$lib.jsa.tmp" "$lib.jsa"
    echo "$java_id" >"$lib.jsa.java"
    say "class archive for the tools' JVMs: $lib.jsa ($(du -h "$lib.jsa" | cut -f1))"
  else
    say "WARNING: no class archive made ($lib.jsa; the tools run without, slower): $(head -c 300 "$work/cds.err")"
  fi
}

verify_kafka_tools() {  # every wrapper: --version prints KAFKA_VERSION on stdout, --help the usage
  local name out errf rc bad=()
  errf=$work/tool.err
  for name in "${!KAFKA_TOOLS[@]}"; do
    if [ -n "${KAFKA_USAGE_ON_STDOUT[$name]:-}" ]; then
      rc=0; "$bin_dir/$name" --help >"$work/tool.out" 2>"$errf" || rc=$?
      if [ $rc -ne 1 ] || ! grep -qF "${KAFKA_USAGE[$name]}" "$work/tool.out"; then
        bad+=("$name --help: exit $rc (want 1, usage on stdout), stderr: $(head -c 400 "$errf")")
      fi
      continue
    fi
    rc=0; out=$("$bin_dir/$name" --version 2>"$errf") || rc=$?
    if [ $rc -ne 0 ] || [ "$out" != "$KAFKA_VERSION" ]; then
      bad+=("$name --version: exit $rc, stdout '$out', stderr: $(head -c 400 "$errf")"); continue
    fi
    rc=0; "$bin_dir/$name" --help >"$work/tool.out" 2>"$errf" || rc=$?
    if [ $rc -ne 1 ] || ! grep -qF "${KAFKA_USAGE[$name]}" "$errf" || [ -s "$work/tool.out" ]; then
      bad+=("$name --help: exit $rc (want 1, usage on stderr), stderr: $(head -c 400 "$errf")")
    fi
  done
  [ ${#bad[@]} -eq 0 ] || fail "the Kafka tool wrappers in ${bin_dir#"$root"/} do not run:" "${bad[@]}"
}

setup_kafka() {
  local dir=$cache/$KAFKA_VERSION new name changed=0 start=$SECONDS
  local lib=$dir/lib log4j=$dir/tools-log4j2.properties
  local stamp="$KAFKA_VERSION $KAFKA_ARTIFACTS" deps="" artifact
  if [ ! -e "$dir/.complete" ] || [ "$(cat "$dir/.complete")" != "$stamp" ] || [ $force -eq 1 ]; then
    require_java_mvn
    say "fetching Apache Kafka $KAFKA_VERSION's command-line tools ($KAFKA_ARTIFACTS) from Maven Central into $dir"
    new=$work/kafka
    for artifact in $KAFKA_ARTIFACTS; do deps+=$(dep "${artifact%%:*}" "${artifact#*:}" "$KAFKA_VERSION"); done
    write_pom "$new" \
      "$deps$(dep org.apache.logging.log4j log4j-slf4j-impl "$LOG4J_VERSION")" \
      "$(dep org.apache.logging.log4j log4j-bom "$LOG4J_VERSION" '<type>pom</type><scope>import</scope>')"
    mvn_run -f "$new/pom.xml" "$DEP_PLUGIN:copy-dependencies" -DincludeScope=runtime \
        -DoutputDirectory="$new/lib" || mvn_failure "$KAFKA_ARTIFACTS at $KAFKA_VERSION"
    mvn_run -f "$new/pom.xml" "$DEP_PLUGIN:list" -DincludeScope=runtime -Dsort=true \
        -DoutputFile="$new/artifacts.txt" || mvn_failure "the dependency list of kafka-tools"
    rm -rf "$dir" && mkdir -p "$dir"
    mv "$new/lib" "$new/artifacts.txt" "$new/pom.xml" "$dir/"
    changed=1
  fi
  cat >"$log4j.tmp" <<'EOF'
# Kafka command-line tools (scripts/kafka_tools.sh): WARN and above, to stderr only.
status = warn
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
EOF
  mv -f "$log4j.tmp" "$log4j"
  mkdir -p "$bin_dir"
  for name in "${!KAFKA_TOOLS[@]}"; do
    write_wrapper "$name" "${KAFKA_TOOLS[$name]}" "$lib" "$log4j" && changed=1
  done
  # what tests/kafka_tools.py reads: the version, the jars, each wrapper's main class
  {
    printf '{\n  "kafka_version": "%s",\n  "lib": "%s",\n  "tools": {\n' "$KAFKA_VERSION" "$lib"
    local sep=""
    for name in $(printf '%s\n' "${!KAFKA_TOOLS[@]}" | sort); do
      printf '%s    "%s": "%s"' "$sep" "$name" "${KAFKA_TOOLS[$name]}"; sep=$',\n'
    done
    printf '\n  }\n}\n'
  } | write_if_changed "$manifest" 644 && changed=1
  build_class_archive "$lib" "$log4j"
  if [ $changed -eq 1 ] || [ $check -eq 1 ] || [ ! -e "$dir/.complete" ]; then
    rm -f "$dir/.complete"
    verify_kafka_tools
    echo "$stamp" >"$dir/.complete"
    say "Kafka $KAFKA_VERSION tools ready in ${bin_dir#"$root"/} ($(du -sh "$lib" | cut -f1) of jars, $((SECONDS - start))s):" \
      "$(printf '%s ' "${!KAFKA_TOOLS[@]}")"
  else
    say "Kafka $KAFKA_VERSION tools present (${bin_dir#"$root"/}/kafka-*, cache $dir)"
  fi
}

# ---- (2) Spark's Kafka connector ------------------------------------------------------------
# spark_connector_version PYSPARK_VERSION: PySpark's own version when Maven Central has
# spark-sql-kafka-0-10_2.13 at it; otherwise (PyPI can publish a PySpark release before its jars
# reach Maven Central) the newest published release (x.y.z, no preview) of the same major version
# that is not newer than PySpark, else the newest of that major. Asks Maven for the artifact's
# metadata (the RELEASE lookup downloads maven-metadata-*.xml into the local repository).
# Sets connector_version.
spark_connector_version() {
  local pv=$1 meta versions v best=""
  mvn_run -U "$DEP_PLUGIN:get" -Dtransitive=false \
    -Dartifact=org.apache.spark:spark-sql-kafka-0-10_2.13:RELEASE:pom || true
  meta=$(find "$m2/org/apache/spark/spark-sql-kafka-0-10_2.13" -maxdepth 1 -name 'maven-metadata-*.xml' 2>/dev/null) || true
  [ -n "$meta" ] || mvn_failure "the versions of org.apache.spark:spark-sql-kafka-0-10_2.13"
  # shellcheck disable=SC2086  # $meta: one or more file names without spaces
  versions=$(sed -n 's:.*<version>\([0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*\)</version>.*:\1:p' $meta | sort -uV)
  if grep -qxF "$pv" <<<"$versions"; then connector_version=$pv; return 0; fi
  for v in $versions; do
    [ "${v%%.*}" = "${pv%%.*}" ] || continue
    if [ "$(printf '%s\n%s\n' "$v" "$pv" | sort -V | tail -n1)" = "$pv" ] || [ -z "$best" ]; then best=$v; fi
  done
  [ -n "$best" ] || fail "Maven Central has no spark-sql-kafka-0-10_2.13 release for Spark ${pv%%.*}.x (PySpark $pv)"
  connector_version=$best
}

verify_spark_kafka() {  # $1: jars.txt; a local-mode session reads "kafka" from a closed port
  local out rc=0
  out=$(JARS_FILE=$1 timeout 300 "$PYTHON" - 2>&1 <<'EOF'
import os, sys
from pyspark.sql import SparkSession

jars = open(os.environ["JARS_FILE"]).read().strip()
spark = (SparkSession.builder.master("local[1]").appName("kafka-tools-check")
         .config("spark.jars", jars).config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
try:
    df = (spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:1")
          .option("subscribe", "lowtide-check")
          .option("kafka.default.api.timeout.ms", "3000").option("kafka.request.timeout.ms", "2000")
          .option("fetchOffset.numRetries", "1").option("fetchOffset.retryIntervalMs", "10")
          .load())
    cols = df.columns
    df.count()
    print("UNEXPECTED: read from 127.0.0.1:1 succeeded")
    sys.exit(1)
except Exception as e:  # noqa: BLE001 - the message is what is checked
    msg = str(e)
    if "ClassNotFound" in msg or "Failed to find data source" in msg or "NoClassDefFound" in msg:
        print("CONNECTOR NOT LOADED:", msg[:2000])
        sys.exit(1)
    kafka = [ln.strip() for ln in msg.splitlines() if "org.apache.kafka.common.errors.TimeoutException" in ln]
    if not kafka:
        print("UNEXPECTED ERROR (want Kafka's TimeoutException):", msg[:2000])
        sys.exit(1)
    print("OK columns=%s error=%s" % (",".join(cols), kafka[-1][:300]))
finally:
    spark.stop()
EOF
) || rc=$?
  if [ $rc -ne 0 ]; then
    fail "Spark's Kafka connector does not load in a local-mode session (exit $rc):" "$(tail -n 20 <<<"$out")"
  fi
  say "spark check: $(grep '^OK ' <<<"$out" | head -c 300)"
}

# The Spark driver's class archive (see lowtide/spark/session.py, LOWTIDE_SPARK_CLASS_ARCHIVE): a
# JVM's class-data-sharing archive of the classes a local-mode job loads (batch, Parquet, Python
# workers, structured streaming), made by one such job run with -XX:ArchiveClassesAtExit, so that
# later drivers map them instead of loading and verifying them again (about half a driver's
# start-up CPU). Per PySpark version (the class path) and java build (recorded beside it: a new
# java makes it again); tests/conftest.py points LOWTIDE_SPARK_CLASS_ARCHIVE at it.
build_spark_class_archive() {  # DIR
  local archive=$1/driver.jsa java_id out rc=0
  java_id=$("${JAVA_HOME:+$JAVA_HOME/bin/}java" -version 2>&1 | tr '\n' ' ')
  if [ -s "$archive" ] && [ "$(cat "$archive.java" 2>/dev/null)" = "$java_id" ] && [ $force -eq 0 ]; then
    return 0
  fi
  rm -f "$archive" "$archive.tmp"
  out=$(ARCHIVE=$archive.tmp SCRATCH=$work/spark-cds timeout 300 "$PYTHON" - 2>&1 <<'EOF'
import os
from pyspark.sql import SparkSession

scratch = os.environ["SCRATCH"]
spark = (SparkSession.builder.master("local[2]").appName("class-archive")
         .config("spark.driver.extraJavaOptions",
                 f"-XX:ArchiveClassesAtExit={os.environ['ARCHIVE']} -Xlog:disable -Xlog:all=error:stderr")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
df = spark.range(0, 10000).selectExpr("id % 7 AS k", "CAST(id AS STRING) AS v")
df.groupBy("k").count().collect()
df.write.mode("overwrite").parquet(f"{scratch}/parquet")
spark.read.parquet(f"{scratch}/parquet").rdd.map(lambda r: r.k).sum()
query = (spark.readStream.format("rate").option("rowsPerSecond", "100").load()
         .writeStream.format("parquet").option("path", f"{scratch}/stream")
         .option("checkpointLocation", f"{scratch}/checkpoint").trigger(processingTime="1 second").start())
query.processAllAvailable()
query.stop()
spark.stop()
print("OK")
EOF
) || rc=$?
  sleep 2  # the JVM writes the archive as it exits, after the Python side
  if [ $rc -eq 0 ] && [ -s "$archive.tmp" ]; then
    mv -f "$archive.tmp" "$archive"
    echo "$java_id" >"$archive.java"
    say "class archive for Spark drivers: $archive ($(du -h "$archive" | cut -f1))"
  else
    rm -f "$archive.tmp"
    say "WARNING: no class archive for Spark drivers made (they start without, slower; exit $rc): $(tail -n 5 <<<"$out")"
  fi
}

setup_spark() {
  local pv cv dir new pj keep="" start=$SECONDS line
  [ -x "$PYTHON" ] || fail "no $PYTHON (run 'make setup' first): it names the PySpark to fetch the connector for"
  pv=$("$PYTHON" -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null) ||
    fail "pyspark is not installed in $PYTHON ('make setup' installs it, extra [spark])"
  pj=$("$PYTHON" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
  dir=$cache/spark-kafka-$pv
  if [ -e "$dir/.complete" ] && [ $force -eq 0 ]; then
    [ $check -eq 1 ] && verify_spark_kafka "$dir/jars.txt"
    say "Spark Kafka connector $(cat "$dir/connector-version") for PySpark $pv present ($dir/jars.txt)"
    build_spark_class_archive "$dir"
    return 0
  fi
  require_java_mvn
  if [ -n "${SPARK_KAFKA_VERSION:-}" ]; then cv=$SPARK_KAFKA_VERSION
  else spark_connector_version "$pv"; cv=$connector_version; fi
  if [ "$cv" != "$pv" ] && [ -z "${SPARK_KAFKA_VERSION:-}" ]; then
    say "NOTE: Maven Central has no spark-sql-kafka-0-10_2.13:$pv; using $cv, the newest published release of Spark ${pv%%.*}.x not newer than PySpark $pv"
  fi
  say "fetching org.apache.spark:spark-sql-kafka-0-10_2.13:$cv for PySpark $pv into $dir"
  new=$work/spark
  write_pom "$new" "$(dep org.apache.spark spark-sql-kafka-0-10_2.13 "$cv")"
  # collect: the dependency graph from the poms alone, no jar downloaded (hadoop-client-runtime...)
  mvn_run -f "$new/pom.xml" "$DEP_PLUGIN:collect" -DincludeScope=runtime -Dsort=true \
      -DoutputFile="$new/all-artifacts.txt" || mvn_failure "org.apache.spark:spark-sql-kafka-0-10_2.13:$cv"
  # keep what PySpark's jars/ lacks (by artifactId): kafka-clients, commons-pool2, the token provider...
  # and fetch exactly those, as direct dependencies without their own (so hadoop-client-runtime & co.,
  # which PySpark ships, are not even downloaded).
  local -a f
  while read -r line; do
    IFS=: read -ra f <<<"$line"   # group:artifact:type[:classifier]:version:scope
    compgen -G "$pj/${f[1]}-[0-9]*.jar" >/dev/null && continue
    echo "$line" >>"$new/artifacts.txt"
    keep+=$(dep "${f[0]}" "${f[1]}" "${f[-2]}" \
      "$([ ${#f[@]} -eq 6 ] && echo "<classifier>${f[3]}</classifier>")<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>")
  done < <(grep -E '^ +[^ :]+:[^ :]+:jar:' "$new/all-artifacts.txt" | sed -E 's/^ +//; s/ .*//')
  [ -n "$keep" ] || fail "no jar left for spark-sql-kafka-0-10_2.13:$cv after removing PySpark's own"
  write_pom "$new/keep" "$keep"
  mvn_run -f "$new/keep/pom.xml" "$DEP_PLUGIN:copy-dependencies" -DincludeScope=runtime \
      -DoutputDirectory="$new/jars" || mvn_failure "the jars of spark-sql-kafka-0-10_2.13:$cv"
  [ "$(find "$new/jars" -name '*.jar' | wc -l)" -eq "$(wc -l <"$new/artifacts.txt")" ] ||
    fail "mvn copied $(find "$new/jars" -name '*.jar' | wc -l) jars, not the $(wc -l <"$new/artifacts.txt") of:" "$(cat "$new/artifacts.txt")"
  rm -rf "$dir" && mkdir -p "$dir"
  mv "$new"/jars/*.jar "$new/artifacts.txt" "$new/keep/pom.xml" "$dir/"
  echo "$cv" >"$dir/connector-version"
  find "$dir" -maxdepth 1 -name '*.jar' | sort | paste -sd, >"$dir/jars.txt"
  verify_spark_kafka "$dir/jars.txt"
  touch "$dir/.complete"
  build_spark_class_archive "$dir"
  say "Spark Kafka connector $cv for PySpark $pv ready ($(du -sh "$dir" | cut -f1), $((SECONDS - start))s): $dir/jars.txt"
  tr , '\n' <"$dir/jars.txt" | sed 's/^/  /'
}

[ $do_kafka -eq 1 ] && setup_kafka
if [ $do_newest -eq 1 ]; then
  # The same fetch, wrappers and checks, for the newest version, beside the pinned one.
  KAFKA_VERSION=$KAFKA_NEWEST_VERSION bin_dir=$root/.tools/bin-newest manifest=$root/.tools/kafka-tools-newest.json
  # Kafka 4.2 moved ConfigCommand from the Scala core jar into kafka-tools.
  KAFKA_TOOLS[kafka-configs]=org.apache.kafka.tools.ConfigCommand
  setup_kafka
fi
[ $do_spark -eq 1 ] && setup_spark
exit 0
