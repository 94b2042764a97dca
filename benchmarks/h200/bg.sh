#!/bin/bash
# A device job longer than one call (600 s): started detached in one call, polled from the next ones
# (each call within 30 s of the last, or the machine goes back). What the job writes under DIR is packed
# into $OUT/<name of DIR>.tgz every 20 s, so a call cut short by the session's device time still
# brings back every load the job finished. A lease ends at 30 minutes held, whatever runs on it: a poll
# that finds no job (a fresh machine) says so and exits 2 at once instead of waiting.
#   bash benchmarks/h200/bg.sh start DIR 'shell command'   # the job's output in DIR/log, its exit status in DIR/rc
#   bash benchmarks/h200/bg.sh poll DIR SECONDS            # returns when the job ends or SECONDS pass
set -u
cmd=$1 dir=$2
pack() {
  tar czf "$OUT/$(basename "$dir").tgz.part" -C "$dir" --exclude=model . 2>/dev/null \
    && mv "$OUT/$(basename "$dir").tgz.part" "$OUT/$(basename "$dir").tgz"
}
case $cmd in
  start)
    mkdir -p "$dir" && : > "$dir/log"  # there before start returns: a poll right after finds the job
    setsid nohup bash -c "$3; echo \$? > '$dir/rc'" > "$dir/log" 2>&1 < /dev/null &
    echo "started $! in $dir" ;;
  poll)
    if [ ! -f "$dir/log" ]; then  # a lease ends at 30 minutes held: the next call meets a fresh machine
      echo "no job started in $dir on this machine: the lease that ran it has ended (30 minutes held, or idle)," \
           "and what it packed last came back with that call" >&2
      exit 2
    fi
    end=$((SECONDS + $3))
    packed=$SECONDS  # the job's end is seen within 2 s (device time), its files packed every 20 s
    while [ $SECONDS -lt "$end" ] && [ ! -f "$dir/rc" ]; do
      sleep 2
      if [ $((SECONDS - packed)) -ge 20 ]; then pack; packed=$SECONDS; fi
    done
    pack
    grep -Ev "(^| )(INFO|WARNING) |it/s\]" "$dir/log" | tail -n 30
    if [ -f "$dir/rc" ]; then echo "JOB ENDED rc=$(cat "$dir/rc")"; else echo "JOB RUNNING"; fi ;;
  *) echo "usage: bg.sh start DIR 'command' | bg.sh poll DIR SECONDS" >&2; exit 2 ;;
esac
