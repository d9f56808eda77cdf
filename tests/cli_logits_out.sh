#!/bin/sh
# cli_logits_out.sh BUILD_DIR: `logits --out PATH` replaces only a regular file, atomically.
# Refused with one line and exit 2: a directory, a FIFO, a symbolic link (to a file or to a
# device) and the device nodes /dev/null and /dev/full (tried only once the directory and FIFO
# refusals pass, so a build without them cannot replace a device node when run as root).
# Written: a new file (mode from the umask), an existing regular file (replaced), and on a
# write error (file size limit) the old file is left as it was; never a temporary file left.
NAME=cli_logits_out
. "$(dirname "$0")/lib_cli.sh"

if ! "$SM" make-model --quiet --preset tiny --experts mxfp4 --seed 1 --out "$T/tiny" >"$T/mm.out" 2>&1; then
    cat "$T/mm.out"; fail make_model; done_
fi
L="logits --model $T/tiny --prompt-ids 5,6,7 --threads 2"
NPY=$((128 + 3 * 512 * 4)) # bytes of [3, 512] f32 after the header
no_tmp() { # name: no temporary file left in $T or $T/o
    if ls -a "$T" "$T/o" 2>/dev/null | grep -q '\.tmp\.'; then fail "$1" "$(ls -a "$T" "$T/o" | grep '\.tmp\.')"; else pass "$1"; fi
}
mkdir "$T/o"

# refused targets
mkdir "$T/o/dir"
bad_msg refuse_directory "--out: $T/o/dir: output exists and is a directory" $L --out "$T/o/dir"
dir_ok=$nf
mkfifo "$T/o/fifo"
bad_msg refuse_fifo "--out: $T/o/fifo: output exists and is a FIFO" $L --out "$T/o/fifo"
if [ -d "$T/o/dir" ] && [ -p "$T/o/fifo" ]; then pass refused_targets_intact; else fail refused_targets_intact; fi
echo keep >"$T/o/real"
ln -s "$T/o/real" "$T/o/link"
bad_msg refuse_symlink_to_file "--out: $T/o/link: output is a symbolic link: refused" $L --out "$T/o/link"
if [ -L "$T/o/link" ] && [ "$(cat "$T/o/real")" = keep ]; then pass symlink_target_intact; else fail symlink_target_intact; fi
ln -s /dev/null "$T/o/devlink"
if [ "$nf" -eq "$dir_ok" ]; then
    bad_msg refuse_symlink_to_device "--out: $T/o/devlink: output is a symbolic link: refused" $L --out "$T/o/devlink"
    bad_msg refuse_dev_null "--out: /dev/null: output exists and is a character device" $L --out /dev/null
    bad_msg refuse_dev_full "--out: /dev/full: output exists and is a character device" $L --out /dev/full
    if [ -c /dev/null ] && ! ls /dev | grep -q '^null\.tmp\.\|^full\.tmp\.'; then pass devices_intact; else fail devices_intact; fi
else
    fail refuse_devices "skipped: directories or FIFOs are not refused"
fi
no_tmp no_tmp_after_refusals

# a new file: complete, mode 0666 & ~umask
umask 022
if "$SM" $L --out "$T/o/new.npy" >/dev/null 2>"$T/err" && [ "$(wc -c <"$T/o/new.npy")" -eq $NPY ] &&
    [ "$(stat -c %a "$T/o/new.npy")" = 644 ]; then
    pass new_file
else
    fail new_file "$(cat "$T/err"; ls -l "$T/o/new.npy")"
fi
# an existing regular file: replaced
echo old >"$T/o/old.npy"
if "$SM" $L --out "$T/o/old.npy" >/dev/null 2>"$T/err" && cmp -s "$T/o/old.npy" "$T/o/new.npy"; then
    pass replace_regular_file
else
    fail replace_regular_file "$(cat "$T/err")"
fi
# a write error (file size limit of 2 kB, SIGXFSZ ignored so write() fails with EFBIG): exit 2,
# one line, the old file untouched
echo old >"$T/o/keep.npy"
(trap '' XFSZ; ulimit -f 4; exec "$SM" $L --out "$T/o/keep.npy") >/dev/null 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && [ "$(cat "$T/o/keep.npy")" = old ]; then
    pass write_error_keeps_old; echo "  $(cat "$T/err")"
else
    fail write_error_keeps_old "rc $rc: $(cat "$T/err")"
fi
no_tmp no_tmp_after_writes
done_
