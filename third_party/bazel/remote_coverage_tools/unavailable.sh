#!/bin/sh
echo "coverage tools are unavailable in this offline build" >&2
exit 0
