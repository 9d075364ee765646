#!/bin/bash
tac /app/input.txt > /app/output.txt
