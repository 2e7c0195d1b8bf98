# Copyright 2025 The Qwen team, Alibaba Group. Licensed under the Apache License, Version 2.0
# (http://www.apache.org/licenses/LICENSE-2.0); distributed on an "AS IS" BASIS, WITHOUT
# WARRANTIES OR CONDITIONS OF ANY KIND.
#
# Vendored for cua_native's differential parser tests only (never imported by the package).
# Source: QwenLM/Qwen3-VL @ 96588727e44c78b25ba03ea03b8e12f7e64fd0da, cookbooks/mobile_agent.ipynb
#   cell 4: rescale_coordinates (verbatim);
#   cells 7 and 9: the statement that reads the model output (verbatim), wrapped in a function
#   here because the notebook runs it at top level on `output_text`.
# ruff: noqa

import json


def rescale_coordinates(point, width, height):
    point = [round(point[0]/999*width), round(point[1]/999*height)]
    return point


def parse_cookbook_output(output_text):
    action = json.loads(output_text.split('<tool_call>\n')[1].split('\n</tool_call>')[0])
    return action
