#!/usr/bin/env bash
# Check the book's internal links: for every book/src/*.md, each relative link `](page.md)` or
# `](page.md#anchor)` (and `](#anchor)` within a page) must point at an existing chapter and, with an
# anchor, at a heading of that chapter that produces the anchor the way mdBook does (lowercase,
# spaces -> '-', characters other than letters, digits, '-' and '_' removed). Images `](images/..)`
# must exist. Exits non-zero listing every broken link. Needs only bash, grep and sed.
set -euo pipefail
cd "$(dirname "$0")/../book/src"

# The anchors of a chapter, one per line (duplicate headings get -1, -2, ... as in mdBook).
anchors() {
  local file=$1
  # Skip fenced code blocks, keep ATX headings, strip the leading #'s.
  sed -n '/^```/,/^```/!p' "$file" | grep -E '^#{1,6} ' | sed -E 's/^#{1,6} +//; s/ +#*$//' |
    while IFS= read -r heading; do
      printf '%s\n' "$heading" | tr '[:upper:]' '[:lower:]' | sed -E 's/<[^>]*>//g; s/ /-/g; s/[^a-z0-9_-]//g'
    done | awk '{ n = seen[$0]++; if (n) print $0 "-" n; else print $0 }'
}

broken=0
for page in *.md; do
  # Relative links: ](target) where target does not start with a scheme or '/'.
  while IFS= read -r link; do
    target=${link#](}
    target=${target%)}
    target=${target%% *}            # drop an optional "title"
    case $target in
      http://* | https://* | mailto:* | /*) continue ;;
    esac
    file=${target%%#*}
    anchor=
    [[ $target == *#* ]] && anchor=${target#*#}
    [ -z "$file" ] && file=$page
    if [ ! -e "$file" ]; then
      echo "$page: broken link ($target): $file does not exist"
      broken=$((broken + 1))
      continue
    fi
    if [ -n "$anchor" ]; then
      if [[ $file != *.md ]] || ! anchors "$file" | grep -qxF -- "$anchor"; then
        echo "$page: broken link ($target): no heading in $file gives the anchor #$anchor"
        broken=$((broken + 1))
      fi
    fi
  done < <(sed -n '/^```/,/^```/!p' "$page" | grep -oE '\]\([^)]+\)' || true)
done

# Every chapter in SUMMARY.md exists (mdBook would create empty ones otherwise).
while IFS= read -r chapter; do
  [ -e "$chapter" ] || { echo "SUMMARY.md: $chapter does not exist"; broken=$((broken + 1)); }
done < <(grep -oE '\]\([^)#]+\.md\)' SUMMARY.md | sed -E 's/^\]\(//; s/\)$//')

if [ "$broken" -gt 0 ]; then
  echo "$broken broken link(s)"
  exit 1
fi
echo "book links OK"
