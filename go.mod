module github.com/countlimit/countlimit

go 1.26
