#!/usr/bin/env bash
# Assembles an English pretraining corpus from Debian-packaged text and builds token files with
# `corelm data build`. Install the packages first: scripts/setup --corpus.
#
#   scripts/build_corpus.sh [OUT_DIR]        (default build/corpus)
#
# Env: CORELM (the binary, default build/release/corelm), THREADS (default: all cores),
#      VOCAB (BPE vocabulary, default 16384), MAN_RENDER=groff|strip (man pages rendered with
#      groff, the default when installed, or roff requests stripped by sed: ~50x faster, rougher),
#      JOBS (parallel renderers, default THREADS), SHARED_DATA (the project's shared data folder,
#      default ../shared/data: its IMDB reviews are added when present), TOKENIZER (a tokenizer.json
#      to encode with instead of training a BPE: a model pretrained on an earlier build of the
#      corpus, e.g. a body that grows across sessions, keeps its vocabulary).
# Writes OUT_DIR/src/<source>/... (the text, per source), OUT_DIR/sources.tsv (bytes per source),
# OUT_DIR/corpus.bin (+ .json), corpus.val.bin (+ .json), corpus.tokenizer.json and
# OUT_DIR/report.json (the build report). A source whose package is missing is skipped with a note.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/corpus}
corelm=${CORELM:-build/release/corelm}
threads=${THREADS:-$(nproc)}
jobs=${JOBS:-$threads}
vocab=${VOCAB:-16384}
tok_args=(--vocab-size "$vocab")
if [[ -n ${TOKENIZER:-} ]]; then
  [[ -f $TOKENIZER ]] || { echo "build_corpus: TOKENIZER=$TOKENIZER is not a file" >&2; exit 1; }
  tok_args=(--tokenizer "$out/corpus.tokenizer.json")  # copied there below, where the recipes look
fi
[[ -x $corelm ]] || { echo "build_corpus: $corelm not found (build it: cmake --build --preset release --target corelm_cli)" >&2; exit 1; }
src=$out/src
rm -rf "$src"
mkdir -p "$src"
if [[ -n ${TOKENIZER:-} ]]; then
  cp "$TOKENIZER" "$out/corpus.tokenizer.json.tmp" && mv "$out/corpus.tokenizer.json.tmp" "$out/corpus.tokenizer.json"
fi
note() { echo "build_corpus: $*" >&2; }

# Man pages (English only: /usr/share/man/manN, not the translated /usr/share/man/LANG/manN),
# rendered without line wrapping or hyphenation so each paragraph is one line.
render_man() {  # FILE -> text on stdout
  if [[ $MAN_RENDER == groff ]]; then
    zcat -f "$1" | groff -t -mandoc -Tutf8 -P-cbou -rLL=2000n -rHY=0 2>/dev/null
  else  # roff requests dropped, font escapes removed, .PP/.SH/.TP become paragraph breaks
    zcat -f "$1" | sed -E -e 's/^\.(PP|LP|P|SH|SS|TP|IP|HP|sp|br)( .*)?$/\n\2/' \
      -e 's/^\.(B|I|BR|IR|RB|BI|IB|RI|SM|SB) +//' -e '/^[.'"'"']/d' -e 's/\\[,\/]//g' \
      -e 's/\\f[BIRP]|\\f\(..|\\f\[[^]]*\]//g' -e 's/\\-/-/g' -e 's/\\\(em/--/g' -e 's/\\&//g' -e 's/\\\(.{2}//g' -e 's/\\//g'
  fi
}
export -f render_man
if command -v groff >/dev/null; then MAN_RENDER=${MAN_RENDER:-groff}; else MAN_RENDER=strip; fi
export MAN_RENDER
mkdir -p "$src/man"
find /usr/share/man/man[1-9] -type f -name '*.gz' 2>/dev/null | sort > "$out/man.list" || true
if [[ -s $out/man.list ]]; then
  note "rendering $(wc -l < "$out/man.list") man pages ($MAN_RENDER, $jobs jobs)"
  # One output file per batch of 200 pages (pages separated by blank lines).
  split -l 200 -d -a 4 "$out/man.list" "$out/man.part."
  ls "$out"/man.part.* | xargs -P "$jobs" -I{} bash -c 'while read -r f; do render_man "$f"; printf "\n\n"; done < "{}" > "{}.txt"'
  for p in "$out"/man.part.*.txt; do mv "$p" "$src/man/$(basename "$p")"; done
  rm -f "$out"/man.part.*
fi

# Info manuals (gzip; the builder reads .gz itself).
mkdir -p "$src/info"
for f in /usr/share/info/*.info*.gz; do [[ -e $f ]] && ln -sf "$f" "$src/info/"; done

# /usr/share/doc: READMEs, NEWS, FAQs, text and reStructuredText files (plain or .gz), but not
# changelogs or copyright files; the builder skips binary files (a NUL byte in the first 64 KiB).
mkdir -p "$src/doc"
find /usr/share/doc -type f \( -iname 'README*' -o -iname 'NEWS*' -o -iname 'FAQ*' -o -iname '*.txt' \
     -o -iname '*.txt.gz' -o -iname '*.rst' -o -iname '*.rst.gz' -o -iname '*.rst.txt' \) \
     ! -path '*/changelog*' ! -name 'copyright' ! -path '*/examples/*' 2>/dev/null | sort > "$out/doc.list"
n=0
while read -r f; do
  n=$((n + 1))
  ln -sf "$f" "$src/doc/$(printf '%06d' $n)-$(basename "$f")"
done < "$out/doc.list"
note "linked $n documentation files"

# HTML manuals (English): the Debian Reference and the Debian Administrator's Handbook.
if command -v html2text >/dev/null; then
  mkdir -p "$src/html"
  for f in /usr/share/debian-reference/*.en.html /usr/share/doc/debian-handbook/html/en-US/*.html; do
    [[ -e $f ]] || continue
    html2text -nobs -utf8 -width 2000 "$f" > "$src/html/$(basename "$(dirname "$f")")-$(basename "$f").txt" 2>/dev/null || true
  done
else
  note "html2text missing: HTML manuals skipped"
fi

# dictd dictionaries (.dict.dz is gzip), English monolingual ones only, with their markup removed:
# {cross references}, <category> tags, GCIDE's \pro*nun"ci*a`tion\ and [1913 Webster] lines.
mkdir -p "$src/dict"
for d in jargon devil foldoc gcide wn; do
  f=/usr/share/dictd/$d.dict.dz
  if [[ -e $f ]]; then
    zcat "$f" | sed -E -e 's/[{}]//g' -e '/^ *\[[0-9]{4} Webster\] *$/d' -e 's/\\[^\\ ]*\\//g' \
      -e 's/^( *)<[a-z0-9, ]+> /\1/' > "$src/dict/$d.txt"
  else
    note "dict-$d not installed"
  fi
done

# The King James Bible, one paragraph per chapter.
if command -v bible >/dev/null; then
  mkdir -p "$src/kjv"
  bible -f "Gen1:1-Rev22:21" | awk '{ ch=$1; sub(/:[0-9]+$/, "", ch); if (ch != last && NR > 1) print ""; last=ch;
                                     sub(/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ /, ""); print }' > "$src/kjv/kjv.txt"
else
  note "bible-kjv not installed"
fi

# Fortunes: entries are separated by lines holding '%'.
if [[ -d /usr/share/games/fortunes ]]; then
  mkdir -p "$src/fortunes"
  for f in /usr/share/games/fortunes/*; do
    [[ -f $f && $f != *.dat && $f != *.u8 ]] || continue
    sed 's/^%$//' "$f" > "$src/fortunes/$(basename "$f").txt"
  done
fi

# IMDB reviews from the shared data, when present: one review a paragraph, <br /> as line breaks.
imdb=${SHARED_DATA:-../shared/data}/corpus/imdb_unsup_50k.txt.zst
if [[ -e $imdb ]]; then
  mkdir -p "$src/imdb"
  zstd -dc "$imdb" | sed -e 's#<br /><br />#\n#g' -e 's#<br />#\n#g' -e 's/$/\n/' > "$src/imdb/imdb_unsup.txt"
fi

# Sizes per source (bytes as read: decompressed).
: > "$out/sources.tsv"
for d in "$src"/*/; do
  name=$(basename "$d")
  bytes=$(find -L "$d" -type f -print0 | xargs -0 -r zcat -f | wc -c)
  files=$(find -L "$d" -type f | wc -l)
  printf '%s\t%s\t%s\n' "$name" "$files" "$bytes" >> "$out/sources.tsv"
done
note "sources (name, files, bytes):"
cat "$out/sources.tsv" >&2

"$corelm" data build --from "$src" --out "$out/corpus.bin" "${tok_args[@]}" --threads "$threads" --json \
  --dropped-log "$out/dropped.jsonl" | tee "$out/report.json"
