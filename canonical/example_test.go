package canonical_test

import (
	"errors"
	"fmt"

	"github.com/seed-a1b882c0/idem/canonical"
)

func ExampleJSON() {
	a, _ := canonical.JSON([]byte(`{ "qty": 1.0, "item": "book" }`))
	b, _ := canonical.JSON([]byte(`{"item":"book","qty":10e-1}`))
	fmt.Println(string(a), string(a) == string(b))

	_, err := canonical.JSON([]byte(`{"item":"book","item":"pen"}`))
	var se *canonical.SyntaxError
	fmt.Println(errors.As(err, &se), se.Reason)
	// Output:
	// {"item":"book","qty":1} true
	// true duplicate member name "item"
}
