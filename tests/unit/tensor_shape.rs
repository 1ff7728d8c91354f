//! Unit tests of `src/tensor/shape.rs`: shapes and their Arrow types.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion_grad::tensor::shape::Shape;

#[test]
fn shapes_round_trip_through_types() {
    for s in [Shape::Scalar, Shape::Vector(3), Shape::Matrix(2, 5)] {
        assert_eq!(Shape::of(&s.data_type()), Some(s));
    }
    let f32_vec =
        DataType::FixedSizeList(Arc::new(Field::new("element", DataType::Float32, false)), 4);
    assert_eq!(Shape::of(&f32_vec), Some(Shape::Vector(4)));
    let ints = DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::Int32, true)), 4);
    assert_eq!(Shape::of(&ints), None);
    assert_eq!(Shape::of(&DataType::Utf8), None);
}
