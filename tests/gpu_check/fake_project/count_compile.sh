#!/bin/sh
# "Compiles" binary $1 of the fake project into $2: counts it in
# $FAKE_STATE/compiles, fails for the target FAKE_BUILD_FAIL names, else
# copies $FAKE_BINARY (fake_binary.c, built by the rehearsal).
echo "$1" >> "${FAKE_STATE:?}/compiles"
if [ "$1" = "${FAKE_BUILD_FAIL:-}" ]; then
  echo "fake compile error in $1" >&2
  exit 1
fi
mkdir -p "$(dirname "$2")" && cp "${FAKE_BINARY:?}" "$2"
