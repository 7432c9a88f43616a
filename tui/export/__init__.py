"""`batchtop replay T --export FILE.cast|FILE.svg`: the dashboard drawn headlessly over a recording, frame
by frame at the recording's own times, written as an asciicast or an animated SVG people can share."""
