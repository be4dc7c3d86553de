package resource

import (
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
)

func cmpProto() cmp.Option { return protocmp.Transform() }
